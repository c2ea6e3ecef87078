"""The library a training script of your own uses under runyard (`entrypoint:` in a run spec).

    from runyard_client import connect
    session = connect()               # reads what runyard's launcher put in the environment
    start = session.resume.step if session.resume else 0   # load session.resume.path yourself
    ...
    session.report(step, loss, tokens=batch_tokens)        # every step; never blocks
    if step % 100 == 0:
        save(...); session.committed(step, path)           # after the save is complete
    if session.should_stop: ...                            # agree across ranks, save, exit 0
    session.finish(step)                                   # all steps trained

It depends on nothing but the standard library and imports nothing of runyard's, so it
installs alone into the script's own environment (`pip install runyard-client`, Python
3.9 or newer). It speaks the worker protocol PROTOCOL_VERSION; connect() refuses a service
that speaks another with ProtocolMismatchError.
"""

from .errors import ProtocolMismatchError
from .protocol import PROTOCOL_VERSION
from .session import Resume, Session, connect

__all__ = ["PROTOCOL_VERSION", "ProtocolMismatchError", "Resume", "Session", "connect"]
