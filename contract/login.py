"""What a `runyard login` MUNGE credential carries, as the CLI makes it and the service
checks it: both must read it the same way.

The payload says what the credential is for. MUNGE proves who made a credential, not why, and
each munged remembers only the credentials it decoded itself: without a purpose, a credential
made for something else (`munge -n`, one of Slurm's) could log its maker in.
"""

from __future__ import annotations

LOGIN_PAYLOAD = "runyard-login"
# The time to live the CLI asks for: it posts the credential at once, so a short life costs
# nothing and leaves a copy little time to be used.
LOGIN_CREDENTIAL_TTL_S = 60
