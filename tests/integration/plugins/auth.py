"""An auth manager with a user the Waits page must refuse, and one that may read some DAGs only.

Airflow's SimpleAuthManager gives every role from viewer up every view and every DAG, so it
cannot show a refusal; this subclass keeps its tokens and users and narrows two decisions:

* ``outsider`` (a viewer) may not see the ``TRIGGERS`` view;
* ``narrow`` (a viewer) sees it, and reads only DAGs whose id starts with ``visible_``.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

CLASSPATH = f"{__name__}.NarrowAuthManager"


class NarrowAuthManager(SimpleAuthManager):
    def is_authorized_view(self, *, access_view: AccessView, user: SimpleAuthManagerUser) -> bool:
        if user.username == "outsider" and access_view == AccessView.TRIGGERS:
            return False
        return super().is_authorized_view(access_view=access_view, user=user)

    def is_authorized_dag(self, *, method: Any, user: SimpleAuthManagerUser, **kwargs: Any) -> bool:
        details = kwargs.get("details")
        if user.username == "narrow" and (details is None or not str(details.id).startswith("visible_")):
            return False
        return super().is_authorized_dag(method=method, user=user, **kwargs)
