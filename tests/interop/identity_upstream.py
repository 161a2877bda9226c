#!/usr/bin/env python3
"""An upstream MCP server built with the official Python SDK's MCPServer that learns who calls
from the tokens foldgate mints for it (`identity = "token"`): its token verifier checks each
bearer token with PyJWT against the key set foldgate serves at /.well-known/jwks.json (issuer
`foldgate`, audience this server's own URL), and its one tool answers as whom it was called.

Usage: identity_upstream.py --port 9101 --jwks http://127.0.0.1:8080/.well-known/jwks.json
"""

from __future__ import annotations

import argparse
import json

import anyio
import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer


class FoldgateTokens:
    """A TokenVerifier trusting what foldgate signs for this server."""

    def __init__(self, jwks_url: str, audience: str) -> None:
        self.keys = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=60)
        self.audience = audience

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = await anyio.to_thread.run_sync(self.keys.get_signing_key_from_jwt, token)
            claims = jwt.decode(token, key.key, algorithms=["EdDSA", "ES256", "RS256"],
                                audience=self.audience, issuer="foldgate",
                                options={"require": ["exp", "iat", "iss", "aud", "sub", "jti"]})
        except jwt.PyJWTError as e:
            print(f"refused a token: {e}", flush=True)
            return None
        return AccessToken(token=token, client_id="foldgate", scopes=claims.get("scope", "").split(),
                           expires_at=claims["exp"], resource=claims["aud"], subject=claims["sub"],
                           claims=claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jwks", required=True)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{args.port}/mcp"
    server = MCPServer(
        "whoami",
        token_verifier=FoldgateTokens(args.jwks, url),
        auth=AuthSettings(issuer_url=args.jwks.removesuffix("/.well-known/jwks.json"),
                          resource_server_url=url, validate_token_resource=True),
    )

    @server.tool()
    def whoami() -> str:
        """Who called this tool, as the caller's verified token says."""
        token = get_access_token()
        claims = (token.claims or {}) if token else {}
        return json.dumps({"tenant": claims.get("tenant"), "sub": claims.get("sub"),
                           "scope": claims.get("scope"), "branch": claims.get("foldgate_branch")})

    server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
