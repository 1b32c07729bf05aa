"""Alembic environment of the replay store: runs on the connection that
``agentrl.replay.migrations`` hands over in ``config.attributes["connection"]`` (inside the
store's write transaction); there is no URL or ini file."""

from __future__ import annotations

from alembic import context

from agentrl.errors import ContractError
from agentrl.replay.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise ContractError(
        "the replay migrations run through agentrl.replay.migrations.upgrade (ReplayStore opens "
        "the database), not from the alembic command line"
    )
context.configure(connection=connection, target_metadata=Base.metadata)
with context.begin_transaction():
    context.run_migrations()
