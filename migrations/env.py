"""Alembic environment: the URL comes from the service's settings (RUNYARD_DATABASE_URL)."""

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine

from service.config import Settings
from service.models import Base

if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)

url = context.config.attributes.get("database_url") or Settings().database_url


def run_migrations_online() -> None:
    connectable = context.config.attributes.get("connection") or create_engine(url)
    if hasattr(connectable, "connect"):
        with connectable.connect() as connection:
            context.configure(connection=connection, target_metadata=Base.metadata)
            with context.begin_transaction():
                context.run_migrations()
    else:
        context.configure(connection=connectable, target_metadata=Base.metadata)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
