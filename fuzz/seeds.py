#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target into target/fuzz-seeds/<target>/.

The seeds are the inputs the test suite uses: the built-in and gitleaks
rule files and the secret samples of crates/foldgate-scrub, the example
configurations, the JSON-RPC messages and tool arguments of the MCP tests,
the key sets of the JWKS tests, tokens shaped as the auth tests shape them,
and tool results as the metering tests build them. Run it from anywhere;
it replaces what it wrote before.
"""

import base64
import json
import random
import re
import shutil
import string
import struct
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "target" / "fuzz-seeds"
rng = random.Random(20261125)


def fill(template: str) -> str:
    """Fills a sample template of builtin_samples.toml deterministically."""
    alphabets = {
        "an": string.ascii_letters + string.digits,
        "alpha": string.ascii_letters,
        "loan": string.ascii_lowercase + string.digits,
        "UPAN": string.ascii_uppercase + string.digits,
        "lo": string.ascii_lowercase,
        "dig": string.digits,
        "hex": "0123456789abcdef",
        "b32": string.ascii_uppercase + "234567",
        "b64": string.ascii_letters + string.digits + "+/",
        "b64u": string.ascii_letters + string.digits + "-_",
        "bech": "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L",
    }

    def one(m: re.Match) -> str:
        if m.group(0) == "{uuid}":
            return "%08x-%04x-%04x-%04x-%012x" % tuple(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))
        kind, n = m.group(1), int(m.group(2))
        return "".join(rng.choice(alphabets[kind]) for _ in range(n))

    text = template.replace("{{", "\x01").replace("}}", "\x02")
    text = re.sub(r"\{uuid\}|\{(\w+):(\d+)\}", one, text)
    return text.replace("\x01", "{").replace("\x02", "}")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def write(target: str, seeds: list[bytes]) -> None:
    folder = SEEDS / target
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i, seed in enumerate(seeds):
        (folder / f"{i:03}").write_bytes(seed)


def samples() -> list[str]:
    data = tomllib.loads((ROOT / "crates/foldgate-scrub/tests/data/builtin_samples.toml").read_text())
    out = []
    for sample in data["sample"]:
        for key in ("positive", "negative"):
            out.extend(fill(t) for t in sample.get(key, []))
    return out


def scrub_seeds(texts: list[str]) -> list[bytes]:
    seeds = [t.encode() for t in texts]
    seeds.append("\n".join(texts[:10]).encode())
    seeds.append(b"password=" + texts[0].encode() + b" and again " + texts[0].encode())
    return seeds


def gitleaks_seeds(texts: list[str]) -> list[bytes]:
    builtin = (ROOT / "crates/foldgate-scrub/src/builtin.toml").read_text()
    gitleaks = (ROOT / "crates/foldgate-scrub/tests/data/gitleaks.toml").read_text()
    seeds = [builtin.encode() + b"\0" + texts[0].encode(), gitleaks.encode() + b"\0" + texts[1].encode()]
    # Each rule of the built-in set alone, with a sample to scrub.
    blocks = re.split(r"(?m)^(?=\[\[rules\]\])", builtin)
    for i, block in enumerate(b for b in blocks if b.startswith("[[rules]]")):
        seeds.append(block.encode() + b"\0" + texts[i % len(texts)].encode())
    seeds.append(
        b'[[rules]]\nid = "go-flags"\nregex = \'\'\'(?i)(?:key|token)\\s*[:=]\\s*([a-z0-9]{20,})\'\'\'\n'
        b'secretGroup = 1\nentropy = 3.0\nkeywords = ["key", "token"]\n'
        b'[[rules.allowlists]]\nregexes = [\'\'\'example\'\'\']\n\0token = abcdefghij0123456789xyz'
    )
    return seeds


def jsonrpc(method: str, params=None, id_=1) -> bytes:
    message = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


def call(name: str, arguments) -> bytes:
    return jsonrpc("tools/call", {"name": name, "arguments": arguments})


def mcp_seeds() -> list[bytes]:
    branch = "br_0192f5e6-7a8b-7c9d-8e0f-123456789abc"
    return [
        jsonrpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "seed", "version": "1"}}),
        jsonrpc("tools/list", {}),
        jsonrpc("ping"),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode(),
        call("branch_create", {"session_id": "s-1", "description": "Find the failing test",
                               "prompt": "Run the suite and report the first failure.",
                               "budget": 4096, "timeout_seconds": 120, "return_tier": "micro"}),
        call("branch_create", {"session_id": "s:2.a_b", "description": "x", "parent_branch_id": branch,
                               "inject_memories": True, "budget": 32768}),
        call("branch_run", {"session_id": "s-1", "description": "Summarise the log", "model": "fast",
                            "tools": ["repo__read_file"], "budget": 256, "timeout_seconds": 600}),
        call("branch_return", {"branch_id": branch, "message": "The cache key omits the tenant.",
                               "outcome": "failure", "extract_memory": True}),
        call("branch_status", {"branch_id": branch}),
        call("branch_status", {"session_id": "s-1"}),
        call("session_end", {"session_id": "s-1"}),
        call("memory_search", {"query": "flaky test retries", "limit": 5}),
        call("memory_record", {"content": "Retry the migration lock once.", "kind": "strategy"}),
        call("memory_feedback", {"lesson_id": "les_0192f5e6-7a8b-7c9d-8e0f-123456789abc", "helpful": True}),
        call("branch_create", {"session_id": "", "description": "d", "budget": -1}),
        call("branch_create", {"session_id": "s", "description": "d", "unknown": 1}),
        call("repo__read_file", {"path": "README.md"}),
        jsonrpc("tools/call", {"name": "branch_status", "arguments": {"branch_id": branch},
                               "_meta": {"foldgate/branch_id": branch, "progressToken": 7}}),
        jsonrpc("tasks/get", {"taskId": "t-1"}),
        jsonrpc("tasks/cancel", {"taskId": "t-1"}),
        b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]',
        b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":7}}',
        b'{"jsonrpc":"2.0","result":{},"id":3}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"branch_create","arguments":[]}}',
        b'{"jsonrpc":"2.0","id":1e400,"method":"ping"}',
        b"[" * 200 + b"]" * 200,
    ]


def jwt_seeds() -> list[bytes]:
    now = 1_800_000_000
    claims = {"iss": "https://idp.example.com", "aud": "https://gateway.example.com/mcp",
              "sub": "agent-7", "tenant": "acme", "scope": "fold:read fold:write",
              "iat": now - 10, "exp": now + 3600}
    variants = [
        claims,
        {**claims, "aud": ["other", "https://gateway.example.com/mcp"], "scp": ["memory:read"]},
        {**claims, "nbf": now + 5, "exp": now + 1.5},
        {**claims, "exp": now - 31},
        {**claims, "tenant": "Not A Tenant!"},
        {**claims, "iss": "https://evil.example.com"},
        {k: v for k, v in claims.items() if k != "sub"},
    ]
    seeds = []
    for kind, alg in enumerate(["HS256", "RS256", "ES256", "EdDSA"]):
        mode = (kind << 1) | 1
        for header in ({"alg": alg, "typ": "JWT"}, {"alg": alg, "kid": "k1"}, {"alg": "none"}, {"alg": "HS256"}):
            for body in variants:
                seeds.append(bytes([mode]) + json.dumps(header).encode() + b"\0" + json.dumps(body).encode())
        raw = ".".join([b64(json.dumps({"alg": alg}).encode()), b64(json.dumps(claims).encode()), b64(b"sig")])
        seeds.append(bytes([kind << 1]) + raw.encode())
    seeds.append(b"\0" + b"a.b")
    seeds.append(b"\0" + b"." * 5)
    return seeds


def jwks_seeds() -> list[bytes]:
    n = ("sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU"
         "1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UX"
         "ERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejv"
         "cI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw")
    x, y = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"
    ed = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    keys = [
        {"kty": "RSA", "kid": "rsa", "n": n, "e": "AQAB"},
        {"kty": "RSA", "kid": "rsa-ps", "alg": "PS256", "use": "sig", "n": n, "e": "AQAB"},
        {"kty": "EC", "kid": "ec", "crv": "P-256", "x": x, "y": y, "key_ops": ["verify"]},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": ed},
        {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        {"kty": "RSA", "kid": "enc", "use": "enc", "n": n, "e": "AQAB"},
        {"kty": "EC", "kid": "ec-mismatch", "alg": "ES384", "crv": "P-256", "x": x, "y": y},
        {"kty": "OKP", "kid": "x25519", "crv": "X25519", "x": ed},
    ]
    seeds = [json.dumps({"keys": keys}).encode()]
    seeds.extend(json.dumps({"keys": [k]}).encode() for k in keys)
    seeds.append(b'{"keys": []}')
    seeds.append(b'{"keys": "no"}')
    return seeds


def upstream_seeds(texts: list[str]) -> list[bytes]:
    results = [
        {"content": [{"type": "text", "text": "hello " * 200}]},
        {"content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second " * 50},
                     {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}]},
        {"content": [{"type": "resource", "resource": {"uri": "file:///a", "text": "body " * 80}}]},
        {"content": [], "structuredContent": {"rows": [1, 2, 3], "note": "n " * 40}},
        {"content": [{"type": "text", "text": "{\"rows\":[1,2,3]}"}], "structuredContent": {"rows": [1, 2, 3]}},
        {"content": [{"type": "text", "text": "failed: " + texts[0]}], "isError": True},
        {"content": [{"type": "text", "text": "key " + texts[1]}], "_meta": {"x": 1}},
        {"message": "upstream error", "data": {"detail": texts[2]}},
        {"content": [{"type": "text", "text": "\u00e9\u4e2d\U0001f600 " * 60}]},
    ]
    seeds = []
    for i, result in enumerate(results):
        for room, flags in ((0, 0), (5, 1), (40, 2), (4000, 3)):
            seeds.append(struct.pack("<I", room) + bytes([flags]) + json.dumps(result).encode())
    return seeds


def config_seeds() -> list[bytes]:
    files = [(ROOT / "deploy/foldgate.toml").read_text()]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        files.extend(re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S))
    envs = [
        "",
        "FOLDGATE_LISTEN=0.0.0.0:8080\nDATABASE_URL=postgres://foldgate:s3cret-password@db:5432/foldgate",
        "FOLDGATE_JWT_SECRET=short\nFOLDGATE_FOLDING__MAX_DEPTH=4",
        "FOLDGATE_JWKS_URL=http://idp.internal/jwks\nFOLDGATE_AUTH__JWKS_ALLOW_HTTP=true",
        "FOLDGATE_ALLOWED_HOSTS=a.example,b.example\nFOLDGATE_FOLDING__LIMITS__MAX_ACTIVE_PER_TENANT=200",
        "FOLDGATE_TELEMETRY__STORE_POLL_INTERVAL=abc\nFOLDGATE_SECRET_TEAM_A=token-value-123",
        "FOLDGATE_DATABASE_URL=sqlite://./x.db?password=hunter22hunter22",
    ]
    return [f.encode() + b"\0" + e.encode() for f in files for e in envs]


def main() -> None:
    texts = samples()
    write("scrub", scrub_seeds(texts))
    write("gitleaks_rules", gitleaks_seeds(texts))
    write("mcp_message", mcp_seeds())
    write("jwt", jwt_seeds())
    write("jwks", jwks_seeds())
    write("upstream_result", upstream_seeds(texts))
    write("config", config_seeds())
    for target in sorted(p.name for p in SEEDS.iterdir() if p.is_dir()):
        print(f"{target}: {len(list((SEEDS / target).iterdir()))} seeds")


if __name__ == "__main__":
    main()
