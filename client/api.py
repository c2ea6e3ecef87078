"""A typed client for the runyard API: one method per endpoint, no raw URLs in commands."""

from __future__ import annotations

import os
import ssl
from typing import Any

import httpx
from runyard_client.errors import InsecureTransport
from runyard_client.tls import ENV_CA, check_token_transport, client_context, is_loopback

from client.dev_state import dev_ca_file
from client.token_store import TokenSource, resolve_token

DEFAULT_PORT = 8000


def default_url() -> str:
    """RUNYARD_URL's default: the dev cluster's service on this host (HTTPS once it has made
    its CA, as `runyard dev up` does)."""
    scheme = "https" if dev_ca_file().exists() else "http"
    return f"{scheme}://127.0.0.1:{DEFAULT_PORT}"


def ca_for(url: str) -> str | None:
    """The CA bundle to verify `url` with: RUNYARD_CA, else the dev cluster's own CA for a
    loopback URL (where the dev cluster serves), else None (the system's store)."""
    if named := os.environ.get(ENV_CA):
        return named
    if is_loopback(url) and dev_ca_file().exists():
        return str(dev_ca_file())
    return None


class ApiError(Exception):
    """The service refused (4xx/5xx) or could not be reached; `message` is for people."""

    def __init__(self, message: str, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.message, self.status, self.body = message, status, body


class InsecureUrl(ApiError):
    """RUNYARD_URL would carry a token in clear to another host, or RUNYARD_CA is not a CA
    bundle: bad input on the caller's side, refused before anything is sent."""


class RunyardClient:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
        ca: str | None = None,
    ) -> None:
        """`ca`: the CA bundle to verify the service with, before ca_for's defaults."""
        self.url = (url or os.environ.get("RUNYARD_URL") or default_url()).rstrip("/")
        # Which token, in order: the caller's, then client/token_store.py's.
        self.token_source = TokenSource.GIVEN
        if not token:
            token, self.token_source = resolve_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # HTTPS verified against RUNYARD_CA or the system's store (runyard_client.tls); a
        # token never goes over plain HTTP to another host: every call is refused before
        # any byte is sent (the refusal waits for the first call, so building a client
        # never raises).
        self._refusal: str | None = None
        verify: ssl.SSLContext | bool = True
        try:
            if token:
                check_token_transport(self.url)
            verify = client_context(ca or ca_for(self.url))
        except InsecureTransport as exc:
            self._refusal = str(exc)
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, verify=verify
        )

    def _call(self, method: str, path: str, *, anonymous: bool = False, **kwargs: Any) -> Any:
        """One request; `anonymous`: without the token (a login proves who calls itself)."""
        if self._refusal is not None:
            raise InsecureUrl(self._refusal)
        try:
            request = self._http.build_request(method, path, **kwargs)
            if anonymous:
                request.headers.pop("Authorization", None)
            response = self._http.send(request)
        except httpx.HTTPError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                raise ApiError(
                    f"the service's certificate at {self.url} failed verification ({exc}); "
                    "set RUNYARD_CA to the CA that signed it"
                ) from exc
            raise ApiError(
                f"cannot reach the runyard service at {self.url} ({exc.__class__.__name__}); "
                "start it with `runyard dev up` or set RUNYARD_URL"
            ) from exc
        if response.is_error:
            try:
                body = response.json()
                detail = body.get("detail", body)
            except ValueError:
                body, detail = response.text, response.text
            raise ApiError(f"{detail}", status=response.status_code, body=body)
        return response.json()

    # runs
    def submit_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/runs", json=spec)

    def dry_run_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/runs/dry-run", json=spec)

    def submit_sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/sweeps", json=spec)

    def dry_run_sweep(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/sweeps/dry-run", json=spec)

    def list_sweeps(self, limit: int = 50) -> dict[str, Any]:
        return self._call("GET", "/v1/sweeps", params={"limit": limit})

    def get_sweep(self, sweep_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/sweeps/{sweep_id}")

    def cancel_sweep(self, sweep_id: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/sweeps/{sweep_id}/cancel")

    def list_runs(
        self, state: str | None = None, limit: int = 50, cluster: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if cluster:
            params["cluster"] = cluster
        return self._call("GET", "/v1/runs", params=params)

    def get_run(self, run_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{run_id}")

    def cancel_run(self, run_id: int, now: bool = False) -> dict[str, Any]:
        params = {"now": "true"} if now else None
        return self._call("POST", f"/v1/runs/{run_id}/cancel", params=params)

    def run_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/runs/{run_id}/checkpoints")

    def run_events(self, run_id: int, after_id: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        return self._call(
            "GET", f"/v1/runs/{run_id}/events", params={"after_id": after_id, "limit": limit}
        )

    def run_metrics(
        self, run_id: int, after_step: int = -1, limit: int = 1000
    ) -> list[dict[str, Any]]:
        return self._call(
            "GET", f"/v1/runs/{run_id}/metrics", params={"after_step": after_step, "limit": limit}
        )

    def run_logs(
        self,
        run_id: int,
        attempt: int | None = None,
        rank: int = 0,
        offset: int = 0,
        limit: int = 256 * 1024,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"rank": rank, "offset": offset, "limit": limit}
        if attempt is not None:
            params["attempt"] = attempt
        return self._call("GET", f"/v1/runs/{run_id}/logs", params=params)

    def run_tracking(self, run_id: int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/runs/{run_id}/tracking")

    # notifications
    def add_notification(self, url: str, events: list[str], format: str) -> dict[str, Any]:
        body = {"url": url, "events": events, "format": format}
        return self._call("POST", "/v1/notifications", json=body)

    def list_notifications(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/notifications")

    def remove_notification(self, subscription_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/notifications/{subscription_id}")

    def test_notification(self, subscription_id: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/notifications/{subscription_id}/test")

    def notification_deliveries(
        self, subscription_id: int | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit}
        if subscription_id is not None:
            params["subscription_id"] = subscription_id
        return self._call("GET", "/v1/notifications/deliveries", params=params)

    # clusters
    def list_clusters(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/clusters")

    # nodes
    def list_nodes(self, cluster: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes", params=_on(cluster))

    def get_node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/nodes/{name}")

    def drain_node(self, name: str, reason: str) -> dict[str, Any] | None:
        return self._call("POST", f"/v1/admin/nodes/{name}/drain", json={"reason": reason})

    def resume_node(
        self, name: str, force: bool = False, cluster: str | None = None
    ) -> dict[str, Any]:
        return self._call(
            "POST",
            f"/v1/admin/nodes/{name}/resume",
            json={"force": force},
            params=_on(cluster),
        )

    def get_spares(self, cluster: str | None = None) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/spares", params=_on(cluster))

    def set_spares(self, target: int, cluster: str | None = None) -> dict[str, Any]:
        return self._call("PUT", "/v1/admin/spares", json={"target": target}, params=_on(cluster))

    def list_incidents(self, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/incidents", params={"limit": limit})

    # logging in, and one's own tokens
    def log_in(self, credential: str) -> dict[str, Any]:
        """Trade a MUNGE credential for a token: both secrets, so never in clear across a
        network (the credential could be replayed before it reaches the service)."""
        try:
            check_token_transport(self.url)
        except InsecureTransport as exc:
            raise InsecureUrl(str(exc)) from None
        return self._call("POST", "/v1/auth/login", anonymous=True, json={"credential": credential})

    def check_credential(self, credential: str) -> dict[str, Any]:
        """Whose the service says a MUNGE credential is (no token made): the doctor's."""
        return self._call("POST", "/v1/auth/check", anonymous=True, json={"credential": credential})

    def log_out(self) -> dict[str, Any]:
        return self._call("POST", "/v1/auth/logout")

    def own_tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens")

    def revoke_own_token(self, token_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tokens/{token_id}")

    # admin
    def create_token(
        self,
        user: str,
        team: str,
        role: str,
        node_name: str | None = None,
        expires_in_days: int | None = None,
        cluster: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "user": user,
            "team": team,
            "role": role,
            "node_name": node_name,
            **({"cluster": cluster} if cluster else {}),
            "expires_in_days": expires_in_days,
        }
        return self._call("POST", "/v1/admin/tokens", json=body)

    def list_tokens(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/tokens")

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/admin/tokens/{token_id}")

    def set_quota(self, team: str, gpu_quota: int | None) -> dict[str, Any]:
        return self._call("PUT", f"/v1/admin/teams/{team}", json={"gpu_quota": gpu_quota})

    def link_user(
        self, user: str, unix_user: str, slurm_account: str | None = None
    ) -> dict[str, Any]:
        body = {"unix_user": unix_user, "slurm_account": slurm_account}
        return self._call("PUT", f"/v1/admin/users/{user}/link", json=body)

    def unlink_user(self, user: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/admin/users/{user}/link")

    def list_users(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/users")

    def service_identity(self) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/service-identity")

    def audit(self, after_id: int = 0) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/admin/audit", params={"after_id": after_id})

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    # plans
    def plan_calibration(self) -> dict[str, Any]:
        return self._call("GET", "/v1/plans/calibration")

    def plan_accuracy(self, limit: int = 200) -> dict[str, Any]:
        return self._call("GET", "/v1/plans/accuracy", params={"limit": limit})


def _on(cluster: str | None) -> dict[str, str] | None:
    """The query that names a cluster (None: the service's default one)."""
    return {"cluster": cluster} if cluster else None
