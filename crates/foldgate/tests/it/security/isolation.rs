//! Tenant isolation.

use super::*;

/// What an intruder's call must look like.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// A tool refusal with this code.
    Refused(&'static str),
    /// `branch_status` by session: as if the session had no branch.
    NoActiveBranch,
}

async fn tenant_isolation(backend: Backend) {
    let gw = TestGateway::start(backend).await;
    let owner = client(&gw.url, &gw.write_token("acme", "alice"), Era::Legacy).await;
    let session = "conv-shared-name";
    let created = ok(&call(
        &owner,
        "branch_create",
        json!({
            "session_id": session,
            "description": "Alice's private investigation",
            "prompt": "Look at the payroll export.",
            "budget": 4096,
        }),
    )
    .await);
    let branch = created["branch_id"].as_str().unwrap().to_owned();
    let before = ok(&call(&owner, "branch_status", json!({"branch_id": branch})).await);
    assert_eq!(before["status"], "active");

    let other_tenant = client(&gw.url, &gw.write_token("globex", "alice"), Era::Legacy).await;
    let same_tenant = client(&gw.url, &gw.write_token("acme", "mallory"), Era::Discover).await;
    for (intruder, who) in [(&other_tenant, "tenant globex"), (&same_tenant, "acme/mallory")] {
        let probes = [
            ("branch_status", json!({"branch_id": branch}), Seen::Refused("branch_not_found")),
            ("branch_status", json!({"session_id": session}), Seen::NoActiveBranch),
            (
                "branch_status",
                json!({"branch_id": branch, "session_id": session}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_return",
                json!({"branch_id": branch, "message": "hijacked"}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_return",
                json!({"branch_id": branch, "message": "hijacked", "outcome": "failure"}),
                Seen::Refused("branch_not_found"),
            ),
            ("session_end", json!({"session_id": session}), Seen::Refused("session_not_found")),
            (
                "branch_create",
                json!({"session_id": session, "description": "child", "parent_branch_id": branch}),
                Seen::Refused("branch_not_found"),
            ),
            (
                "branch_create",
                json!({"session_id": "elsewhere", "description": "c", "parent_branch_id": branch}),
                Seen::Refused("branch_not_found"),
            ),
            // After the refused creates, the session is still not theirs.
            ("session_end", json!({"session_id": session}), Seen::Refused("session_not_found")),
            ("branch_status", json!({"session_id": session}), Seen::NoActiveBranch),
        ];
        for (tool, args, seen) in probes {
            let why = format!("{who}: {tool} {args}");
            let result = call(intruder, tool, args).await;
            match seen {
                Seen::Refused(code) => assert_eq!(refusal(&result).0, code, "{why}"),
                Seen::NoActiveBranch => assert_eq!(
                    Value::Object(ok(&result)),
                    json!({
                        "branch_id": null,
                        "status": "No active branch found",
                        "session_tokens_returned": 0,
                    }),
                    "{why}"
                ),
            }
        }
    }

    // Another subject in the same tenant cannot open branches in the session.
    let result =
        call(&same_tenant, "branch_create", json!({"session_id": session, "description": "squat"}))
            .await;
    assert_eq!(refusal(&result).0, "session_not_found", "acme/mallory creates in alice's session");

    // Another tenant using the same session name gets a session of its own.
    let theirs = ok(&call(
        &other_tenant,
        "branch_create",
        json!({"session_id": session, "description": "globex's own work"}),
    )
    .await);
    assert_eq!(theirs["depth"], 1, "not nested under alice's branch");
    assert_eq!(theirs["parent_branch_id"], Value::Null);
    let ended = ok(&call(&other_tenant, "session_end", json!({"session_id": session})).await);
    assert_eq!(ended["branches_ended"], 1, "only globex's branch");

    // Alice's branch is exactly as it was, and still hers to finish.
    let after = ok(&call(&owner, "branch_status", json!({"branch_id": branch})).await);
    assert_eq!(after, before, "alice's branch changed");
    let current = ok(&call(&owner, "branch_status", json!({"session_id": session})).await);
    assert_eq!(current["branch_id"], branch.as_str());
    let returned = ok(&call(
        &owner,
        "branch_return",
        json!({"branch_id": branch, "message": "Payroll export is fine."}),
    )
    .await);
    assert_eq!(returned["status"], "completed");
    assert_eq!(returned["message"], "Payroll export is fine.");
    assert_eq!(returned["children_force_returned"], json!([]));

    for c in [owner, other_tenant, same_tenant] {
        c.cancel().await.unwrap();
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_sqlite() {
    tenant_isolation(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_postgres() {
    tenant_isolation(Backend::Postgres).await;
}
