"""Who may call `rlstream serve`: the bearer token, or for a GET the web view's sign-in cookie."""

import secrets

COOKIE = "rlstream_token"  # the web view's copy of the token (GET requests only)


def authorized_by(request, token: str | None) -> bool:
    """The request carries the token: as a bearer header, or for a GET as the web view's cookie
    (a cookie alone never changes a run, so another site cannot forge a change)."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = request.cookies.get(COOKIE, "") if request.method in ("GET", "HEAD") else ""
    return bool(given) and secrets.compare_digest(given, token)


def authorized_dependency(token: str | None):
    from fastapi import Depends, HTTPException, Request
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    bearer = HTTPBearer(auto_error=False)  # declares the scheme in the OpenAPI docs

    def authorized(request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)):
        if not authorized_by(request, token):
            raise HTTPException(401, "missing or wrong bearer token (RLSTREAM_API_TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})  # fmt: skip

    return authorized
