//! Slow and idle connections, request bodies, malformed JSON-RPC and
//! invalid arguments.

use super::*;

/// Reads from `stream` until the server closes it, for at most `limit`;
/// returns what was read, or `None` if the connection was still open.
async fn read_until_closed(
    stream: &mut tokio::net::TcpStream,
    limit: std::time::Duration,
) -> Option<Vec<u8>> {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read_all).await.ok().map(|()| received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_and_idle_connections_are_closed() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.header_read_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let limit = std::time::Duration::from_secs(15);

    // Half a request head, then silence.
    let mut half = tokio::net::TcpStream::connect(gw.running.addr).await.unwrap();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl").await.unwrap();
    let answer = read_until_closed(&mut half, limit).await;
    assert!(answer.is_some(), "a half-sent request head kept its connection open");

    // A complete request is answered; the kept-alive connection is then
    // closed once it stays idle.
    let mut idle = tokio::net::TcpStream::connect(gw.running.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let answer = read_until_closed(&mut idle, limit)
        .await
        .expect("an idle kept-alive connection stayed open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A connection that keeps sending complete requests is served for
    // longer than the timeout.
    let http = reqwest::Client::new();
    for _ in 0..4 {
        let health = http.get(format!("{}/healthz", gw.base)).send().await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    gw.stop().await;
}

// ---------------------------------------------------------------------------
// Request bodies

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_with_413() {
    let gw = TestGateway::start_with(Backend::Sqlite, |c| c.api.max_body_bytes = 4096).await;
    let token = gw.write_token("acme", "alice");
    let call_with_prompt = |len: usize| {
        tool_call(
            Wire::Legacy,
            "branch_create",
            &json!({"session_id": "s", "description": "d", "prompt": "p".repeat(len)}),
        )
        .to_string()
    };
    let small = call_with_prompt(3000);
    let large = call_with_prompt(10 * 1024);
    assert!(small.len() < 4096 && large.len() > 10 * 1024);

    // The control: a body under the limit passes.
    let reply = post_raw(&gw, Some(&token), small.clone()).await;
    assert_eq!(reply.tool_result("3 KB body")["depth"], 1);

    let addr = gw.running.addr;
    let head = |extra: &str| {
        format!(
            "POST /mcp HTTP/1.1\nHost: {addr}\nAuthorization: Bearer {token}\n\
             Content-Type: application/json\nAccept: application/json, text/event-stream\n\
             MCP-Protocol-Version: 2025-11-25\nConnection: close\n{extra}\n"
        )
    };
    let chunked = {
        let mut body = Vec::new();
        for chunk in large.as_bytes().chunks(1000) {
            write!(body, "{:x}\r\n", chunk.len()).unwrap();
            body.extend_from_slice(chunk);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"0\r\n\r\n");
        body
    };
    let cases: Vec<(Reply, &str)> = vec![
        (post_raw(&gw, Some(&token), large.clone()).await, "10 KB with Content-Length"),
        (
            raw_http(&gw, &head("Transfer-Encoding: chunked\n"), &chunked).await,
            "10 KB chunked, no Content-Length",
        ),
        (
            raw_http(&gw, &head("Content-Length: 100000000\n"), small.as_bytes()).await,
            "Content-Length over the limit, short body sent",
        ),
        (post_raw(&gw, None, large.clone()).await, "10 KB without a token"),
    ];
    for (reply, why) in cases {
        let error = reply.jsonrpc_error(StatusCode::PAYLOAD_TOO_LARGE, -32600, why);
        assert!(error["message"].as_str().unwrap().contains("4096"), "{why}: {error}");
    }

    // Without a declared length nothing is read before authentication: a
    // chunked body without a token is refused as unauthenticated, unread.
    let anonymous = head("Transfer-Encoding: chunked\n")
        .replace(&format!("Authorization: Bearer {token}\n"), "");
    let reply = raw_http(&gw, &anonymous, &chunked).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{:?}", reply.body);

    // A chunked body under the limit is read whole and served.
    let mut body = Vec::new();
    for chunk in small.as_bytes().chunks(700) {
        write!(body, "{:x}\r\n", chunk.len()).unwrap();
        body.extend_from_slice(chunk);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    let reply = raw_http(&gw, &head("Transfer-Encoding: chunked\n"), &body).await;
    assert_eq!(reply.tool_result("3 KB chunked")["depth"], 2);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_rpc_is_refused_with_400() {
    let gw = TestGateway::start(Backend::Sqlite).await;
    let token = gw.write_token("acme", "alice");
    let valid = tool_call(Wire::Legacy, "branch_status", &json!({"session_id": "s"}));
    let cases: Vec<(String, i64, &str)> = vec![
        ("{not json".to_owned(), -32700, "malformed JSON"),
        (String::new(), -32700, "empty body"),
        (r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/call""#.to_owned(), -32700, "truncated"),
        (r#"{"hello": 1}"#.to_owned(), -32600, "an object that is not JSON-RPC"),
        (json!([valid]).to_string(), -32600, "a batch"),
        ("[]".to_owned(), -32600, "an empty batch"),
        (r#""tools/call""#.to_owned(), -32600, "a string"),
        ("42".to_owned(), -32600, "a number"),
        (patched(valid.clone(), &json!({"jsonrpc": "1.0"})).to_string(), -32600, "jsonrpc 1.0"),
        (patched(valid.clone(), &json!({"jsonrpc": 2})).to_string(), -32600, "jsonrpc a number"),
        (
            {
                let mut v = valid.clone();
                v.as_object_mut().unwrap().remove("jsonrpc");
                v.to_string()
            },
            -32600,
            "no jsonrpc member",
        ),
        (patched(valid.clone(), &json!({"method": 5})).to_string(), -32600, "method a number"),
        (patched(valid.clone(), &json!({"id": {"n": 1}})).to_string(), -32600, "id an object"),
        (patched(valid.clone(), &json!({"id": true})).to_string(), -32600, "id a boolean"),
        (patched(valid.clone(), &json!({"params": "x"})).to_string(), -32602, "params a string"),
        (
            patched(valid.clone(), &json!({"params": {"name": 5}})).to_string(),
            -32602,
            "tool name a number",
        ),
        (patched(valid.clone(), &json!({"params": {}})).to_string(), -32602, "no tool name"),
        (r#"{"jsonrpc": "2.0", "id": 1}"#.to_owned(), -32600, "neither request nor response"),
        (
            r#"{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "ping"}"#.to_owned(),
            -32600,
            "a repeated member",
        ),
    ];
    for (body, code, why) in cases {
        let reply = post_raw(&gw, Some(&token), body).await;
        reply.jsonrpc_error(StatusCode::BAD_REQUEST, code, why);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_argument_is_a_400_naming_the_field() {
    // Some 130 calls in a row from one principal, answered faster than the
    // default rate allows: the rate limit is another test's subject.
    let gw = TestGateway::start_with(Backend::Sqlite, |c| {
        c.api.rate_limit.per_second = 10_000;
        c.api.rate_limit.burst = 10_000;
    })
    .await;
    let token = gw.write_token("acme", "alice");
    let id = UNKNOWN_BRANCH;
    let create = |changes: Value| patched(json!({"session_id": "s", "description": "d"}), &changes);
    let ret = |changes: Value| patched(json!({"branch_id": id, "message": "m"}), &changes);
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        // branch_create
        ("branch_create", json!({"description": "d"}), "session_id", "session_id missing"),
        ("branch_create", create(json!({"session_id": 5})), "session_id", "session_id type"),
        ("branch_create", create(json!({"session_id": ""})), "session_id", "session_id empty"),
        ("branch_create", create(json!({"session_id": "a b"})), "session_id", "session_id space"),
        ("branch_create", create(json!({"session_id": "a/b"})), "session_id", "session_id slash"),
        (
            "branch_create",
            create(json!({"session_id": "s".repeat(129)})),
            "session_id",
            "session_id 129 chars",
        ),
        ("branch_create", json!({"session_id": "s"}), "description", "description missing"),
        ("branch_create", create(json!({"description": ""})), "description", "description empty"),
        (
            "branch_create",
            create(json!({"description": "\u{7}\u{1b}"})),
            "description",
            "description only control characters",
        ),
        (
            "branch_create",
            create(json!({"description": "x".repeat(501)})),
            "description",
            "description 501 chars",
        ),
        ("branch_create", create(json!({"description": ["d"]})), "description", "description type"),
        (
            "branch_create",
            create(json!({"prompt": "x".repeat(10_001)})),
            "prompt",
            "prompt 10,001 chars",
        ),
        ("branch_create", create(json!({"prompt": 1})), "prompt", "prompt type"),
        ("branch_create", create(json!({"budget": "big"})), "budget", "budget type"),
        ("branch_create", create(json!({"budget": 1.5})), "budget", "budget fraction"),
        ("branch_create", create(json!({"budget": true})), "budget", "budget boolean"),
        ("branch_create", create(json!({"budget": 10})), "budget", "budget under the minimum"),
        ("branch_create", create(json!({"budget": -1})), "budget", "budget negative"),
        // A huge integral float (`1e300`) is an integer, capped like any
        // large budget (args tests); a huge negative one is under the minimum.
        (
            "branch_create",
            create(json!({"budget": -1e300})),
            "budget",
            "budget huge negative float",
        ),
        (
            "branch_create",
            create(json!({"timeout_seconds": 0})),
            "timeout_seconds",
            "timeout_seconds zero",
        ),
        (
            "branch_create",
            create(json!({"timeout_seconds": -5})),
            "timeout_seconds",
            "timeout_seconds negative",
        ),
        (
            "branch_create",
            create(json!({"timeout_seconds": "60"})),
            "timeout_seconds",
            "timeout_seconds type",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": "x"})),
            "parent_branch_id",
            "parent_branch_id format",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": "br_not-a-uuid"})),
            "parent_branch_id",
            "parent_branch_id not a UUID",
        ),
        (
            "branch_create",
            create(json!({"parent_branch_id": 3})),
            "parent_branch_id",
            "parent_branch_id type",
        ),
        ("branch_create", create(json!({"tenant": "globex"})), "tenant", "unknown argument"),
        // branch_return
        ("branch_return", json!({"message": "m"}), "branch_id", "branch_id missing"),
        ("branch_return", ret(json!({"branch_id": "nope"})), "branch_id", "branch_id format"),
        ("branch_return", ret(json!({"branch_id": 42})), "branch_id", "branch_id type"),
        (
            "branch_return",
            ret(json!({"branch_id": id.to_uppercase()})),
            "branch_id",
            "branch_id prefix case",
        ),
        ("branch_return", json!({"branch_id": id}), "message", "message missing"),
        (
            "branch_return",
            ret(json!({"message": "x".repeat(50_001)})),
            "message",
            "message 50,001 chars",
        ),
        ("branch_return", ret(json!({"message": {"text": "m"}})), "message", "message type"),
        ("branch_return", ret(json!({"outcome": "meh"})), "outcome", "outcome value"),
        ("branch_return", ret(json!({"outcome": 1})), "outcome", "outcome type"),
        ("branch_return", ret(json!({"tokens_used": 1})), "tokens_used", "unknown argument"),
        // branch_status
        ("branch_status", json!({}), "branch_id", "neither id"),
        ("branch_status", json!({"branch_id": null, "session_id": null}), "branch_id", "both null"),
        ("branch_status", json!({"branch_id": "x"}), "branch_id", "branch_id format"),
        ("branch_status", json!({"session_id": ""}), "session_id", "session_id empty"),
        ("branch_status", json!({"session_id": "a b"}), "session_id", "session_id format"),
        ("branch_status", json!({"session_id": "s", "depth": 1}), "depth", "unknown argument"),
        // session_end
        ("session_end", json!({}), "session_id", "session_id missing"),
        ("session_end", json!({"session_id": "bad id!"}), "session_id", "session_id format"),
        (
            "session_end",
            json!({"session_id": "s".repeat(129)}),
            "session_id",
            "session_id 129 chars",
        ),
        ("session_end", json!({"session_id": "s", "force": true}), "force", "unknown argument"),
    ];
    let http = reqwest::Client::new();
    for wire in [Wire::Legacy, Wire::Modern] {
        for (tool, args, field, why) in &cases {
            let why = format!("{wire:?} {tool}: {why}");
            let req = mcp_request(&http, &gw.url, Some(&token), wire)
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", *tool)
                .body(tool_call(wire, tool, args).to_string());
            let reply = send(req).await;
            let error = reply.jsonrpc_error(StatusCode::BAD_REQUEST, -32602, &why);
            assert_eq!(reply.body["id"], 7, "{why}: the request id is echoed");
            assert_eq!(error["data"]["field"], *field, "{why}: {error}");
            assert!(error["data"]["reason"].as_str().is_some_and(|r| !r.is_empty()), "{why}");
        }
        // Arguments that are not an object.
        let req = mcp_request(&http, &gw.url, Some(&token), wire)
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", "branch_create")
            .body(tool_call(wire, "branch_create", &json!(["s", "d"])).to_string());
        let reply = send(req).await;
        let error = reply.jsonrpc_error(StatusCode::BAD_REQUEST, -32602, "arguments an array");
        assert_eq!(error["data"]["field"], "arguments");
    }

    // The controls, in both eras: valid calls of each tool pass.
    for wire in [Wire::Legacy, Wire::Modern] {
        let session = format!("valid-{wire:?}");
        let mut branch = None;
        for (tool, args) in [
            ("branch_create", json!({"session_id": session, "description": "d", "budget": 256.0})),
            ("branch_status", json!({"session_id": session})),
            ("branch_return", json!({"message": "done", "outcome": "success"})),
            ("session_end", json!({"session_id": session})),
        ] {
            let mut args = args;
            if tool == "branch_return" {
                args["branch_id"] = json!(branch.clone().unwrap());
            }
            let req = mcp_request(&http, &gw.url, Some(&token), wire)
                .header("Mcp-Method", "tools/call")
                .header("Mcp-Name", tool)
                .body(tool_call(wire, tool, &args).to_string());
            let reply = send(req).await;
            let result = reply.tool_result(&format!("{wire:?} valid {tool}"));
            if tool == "branch_create" {
                branch = Some(result["branch_id"].as_str().unwrap().to_owned());
            }
        }
    }
    gw.stop().await;
}
