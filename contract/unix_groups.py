"""Who is in a Unix group: its listed members and every login whose primary group it is.
The service links users only to logins in the owner group, and the doctor lists the group's
members: both must mean the same membership."""

from __future__ import annotations

import grp
import pwd


def group_members(group: str) -> frozenset[str]:
    """The logins in `group`, supplementary or primary; KeyError when there is no such group."""
    found = grp.getgrnam(group)
    primary = {entry.pw_name for entry in pwd.getpwall() if entry.pw_gid == found.gr_gid}
    return frozenset(found.gr_mem) | primary
