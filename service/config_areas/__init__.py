"""The service's settings, one class per area an operator tunes (service/config.py composes
them into `Settings`).

Each module holds one area: its fields, their validators, and what derives from them alone.
Every field is read from RUNYARD_<FIELD> (base.py), whichever area holds it, and
docs/install.md lists them area by area (`python -m service.config_doc --write`).
"""
