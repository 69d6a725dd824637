"""Deployments made through the admin API (`POST /v1/deployments`), as the store keeps them. Sans-IO.

The store holds each one's `deployments:` entry as JSON text (`spec`), which the
gateway reads with its own config rules (gateway/deployadmin.py); the ledger
never interprets it. A PUT replaces the row of the same id (a PATCH is a PUT of
the merged entry); a DELETE removes it.
"""

from __future__ import annotations

import msgspec


class StoredDeployment(msgspec.Struct, kw_only=True):
    id: str
    name: str
    spec: str  # the deployment's config entry, JSON
    created: int = 0  # unix seconds
    updated: int = 0


class DeploymentExists(Exception):
    """Another deployment of the store has this name."""


COLUMNS = ("id", "name", "spec", "created", "updated")
