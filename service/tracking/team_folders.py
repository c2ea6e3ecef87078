"""The trackers' folders on disk: TensorBoard's event files and W&B's offline runs, under
<root>/<team>/.

Made under the service's umask (022 at most sites) they were 0755 and 0644: every user of
the host could read every team's losses, parameters and events. Now every folder is 0750
and every file the service writes 0640, whatever the umask: the service and the folder's
group read them, nobody else. A team's folder belongs to the Unix group named like the team
when the service is a member of it (the site's choice, docs/operations.md, "Experiment
trackers"), otherwise to the service's own group, and carries the setgid bit, so whatever
is made under it (wandb's own files too) keeps that group.
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

FOLDER_MODE = 0o750
FILE_MODE = 0o640


def _team_gid(team: str) -> int | None:
    """The Unix group named like the team, if the service may give folders to it."""
    try:
        gid = grp.getgrnam(team).gr_gid
    except KeyError:
        return None
    return gid if gid == os.getegid() or gid in os.getgroups() else None


def _own(path: Path, mode: int, gid: int | None = None) -> None:
    """`path` (a folder of the service's, never followed if a link) to `mode` and `gid`."""
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return  # a site's folder above ours, or not ours to change: left as it is
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def team_folder(root: Path, team: str, *below: str) -> Path:
    """<root>/<team>/<below...>, made if missing, each folder the service owns 0750, the
    team's with its group and setgid."""
    folder = root.joinpath(team, *below)
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    _own(root, FOLDER_MODE | (root.lstat().st_mode & stat.S_ISGID))
    _own(root / team, FOLDER_MODE | stat.S_ISGID, _team_gid(team))
    for depth in range(1, len(below) + 1):
        _own(root.joinpath(team, *below[:depth]), FOLDER_MODE | stat.S_ISGID)
    return folder


def private_files(folder: Path, pattern: str) -> None:
    """The service's files in `folder` matching `pattern` to 0640."""
    for path in folder.glob(pattern):
        st = path.lstat()
        ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
        if ours and stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.chmod(path, FILE_MODE)
