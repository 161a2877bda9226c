//! Results charged to their branch's budget: typed results, a fold of ten
//! files, overruns, results cut together, and results of ended branches.

use super::*;

on_both_backends!(
    ten_file_fold,
    a_typed_result_is_charged_once_and_cut_into_an_error,
    overrun,
    concurrent_results_are_cut_at_the_budget_together,
    a_result_is_withheld_when_its_branch_ended_during_the_call,
);

/// A result with both `content` and `structuredContent` (the same text
/// twice) is charged once, as its content; cut at the budget, it becomes an
/// error result, since what is left cannot match the tool's output schema.
async fn a_typed_result_is_charged_once_and_cut_into_an_error(backend: Backend) {
    let Federation { files: _files, gw, agent } =
        Federation::start(backend, Era::Legacy, all_files_config, "files__read_typed").await;
    let tokens = counter();
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "typed", "description": "typed reads", "budget": 4000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();

    let args = json!({"path": "src/lib.rs", "lines": 30});
    let result = call_in(&agent, &id, "files__read_typed", args.clone()).await;
    assert_ne!(result.is_error, Some(true));
    assert!(result.structured_content.is_some(), "a whole result keeps its structured content");
    let text = file_text("src/lib.rs", 30);
    let report = metering(&result);
    assert_eq!(report["tokens_out"], tokens.count(&text), "the text once, not twice");
    assert_eq!(
        report["budget_used"].as_u64().unwrap(),
        created["budget_used"].as_u64().unwrap()
            + tokens.count(&args.to_string())
            + tokens.count(&text)
    );

    let big =
        call_in(&agent, &id, "files__read_typed", json!({"path": "big.rs", "lines": 400})).await;
    assert_eq!(big.is_error, Some(true), "a cut typed result is an error result: {big:?}");
    assert!(big.structured_content.is_none());
    let shown = text_of(&big);
    assert!(shown.contains("[foldgate: result truncated at the branch's token budget"), "{shown}");
    assert_eq!(metering(&big)["truncated"], true);
    agent.cancel().await.unwrap();
    gw.stop().await;
}

/// The spec's scenario P1: a branch reads ten files through an upstream
/// and returns a short summary. Everything that passed through is charged.
async fn ten_file_fold(backend: Backend) {
    let Federation { files, gw, agent } =
        Federation::start(backend, Era::Legacy, acme_files, "files__read_file").await;
    let tokens = counter();

    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "debug-1", "description": "Find where retries are configured", "budget": 16000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let mut expected_used = created["budget_used"].as_u64().unwrap();
    let mut passed = 0;
    for i in 0..10 {
        let args = json!({"path": format!("src/module_{i}.rs")});
        // Half name the branch, half rely on the session's active branch.
        let result = if i % 2 == 0 {
            call_in(&agent, &id, "files__read_file", args.clone()).await
        } else {
            call(&agent, "files__read_file", args.clone()).await
        };
        let text = text_of(&result);
        assert_eq!(text, file_text(&format!("src/module_{i}.rs"), 12), "unchanged");
        let tokens_in = tokens.count(&args.to_string());
        let tokens_out = tokens.count(&text);
        let report = metering(&result);
        assert_eq!(report["branch_id"], id.as_str());
        assert_eq!(
            (report["tokens_in"].as_u64().unwrap(), report["tokens_out"].as_u64().unwrap()),
            (tokens_in, tokens_out)
        );
        expected_used += tokens_in + tokens_out;
        passed += tokens_out;
        assert_eq!(report["budget_used"].as_u64().unwrap(), expected_used);
    }
    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(
        status["budget_used"].as_u64().unwrap(),
        expected_used,
        "the budget consumed is what passed through"
    );
    assert_eq!(status["calls"]["count"], 10);
    assert_eq!(status["calls"]["tokens_out"].as_u64().unwrap(), passed);
    assert_eq!(status["calls"]["by_tool"][0]["tool"], "files__read_file");
    assert_eq!(status["calls"]["errors"], 0);
    assert!(passed > 3000, "ten large files: {passed} tokens");

    let summary = "Retries are configured in src/module_3.rs: handler_7 calls retry(req, 7).";
    let returned =
        ok(&call(&agent, "branch_return", json!({"branch_id": id, "message": summary})).await);
    assert_eq!(returned["tokens_returned"].as_u64().unwrap(), tokens.count(summary));
    assert_eq!(returned["tokens_used"].as_u64().unwrap(), expected_used + tokens.count(summary));
    let ratio = returned["compression_ratio"].as_f64().unwrap();
    assert!(ratio > 0.9, "compression {ratio}");

    gw.stop().await;
    files.down().await;
}

/// A result larger than what the branch has left is cut at the budget,
/// marked, and the branch is force-returned; its parent gets back the rest.
async fn overrun(backend: Backend) {
    let Federation { files, gw, agent } =
        Federation::start(backend, Era::Discover, acme_files, "files__read_file").await;

    let parent = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "parent", "budget": 8000}),
    )
    .await);
    let parent_id = parent["branch_id"].as_str().unwrap().to_owned();
    let parent_prompt = parent["budget_used"].as_u64().unwrap();
    let child = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "child", "budget": 600}),
    )
    .await);
    let child_id = child["branch_id"].as_str().unwrap().to_owned();

    let result =
        call_in(&agent, &child_id, "files__read_file", json!({"path": "big.rs", "lines": 200}))
            .await;
    let text = text_of(&result);
    assert!(text.contains("[foldgate: result truncated at the branch's token budget"), "{text}");
    assert!(text.starts_with("// big.rs:0\n"), "the start of the result is kept");
    let report = metering(&result);
    assert_eq!(report["truncated"], true);
    assert_eq!(report["branch_force_returned"], true);
    assert_eq!(report["budget_used"], 600);
    assert!(counter().count(&text) <= 600);

    let child = ok(&call(&agent, "branch_status", json!({"branch_id": child_id})).await);
    assert_eq!(
        (child["status"].as_str(), child["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );
    assert_eq!(child["budget_used"], 600);
    assert_eq!(child["calls"]["truncated"], 1);
    let parent = ok(&call(&agent, "branch_status", json!({"branch_id": parent_id})).await);
    assert_eq!(parent["status"], "active");
    assert_eq!(parent["budget_lent_to_children"], 0, "the loan is released");
    assert_eq!(
        parent["budget_used"].as_u64().unwrap(),
        parent_prompt + 600,
        "the child's spending, no more"
    );

    // The ended branch takes no more calls; the parent is current again.
    let refused = call_in(&agent, &child_id, "files__echo", json!({"text": "x"})).await;
    assert_eq!(refusal(&refused).0, "branch_not_active");
    let echoed = call(&agent, "files__echo", json!({"text": "back in the parent"})).await;
    assert_eq!(metering(&echoed)["branch_id"], parent_id.as_str());

    // Arguments that alone use up what is left are not forwarded.
    let small = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "tiny", "budget": 256}),
    )
    .await);
    let small_id = small["branch_id"].as_str().unwrap().to_owned();
    let refused =
        call_in(&agent, &small_id, "files__echo", json!({"text": "word ".repeat(400)})).await;
    assert_eq!(refusal(&refused).0, "budget_exhausted");
    let small = ok(&call(&agent, "branch_status", json!({"branch_id": small_id})).await);
    assert_eq!(
        (small["status"].as_str(), small["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );

    gw.stop().await;
    files.down().await;
}

/// Three calls in one branch, each of whose results fits what the branch
/// had left when the call was made, but not all three: the charges, not
/// the read before each call, decide what the agent receives.
async fn concurrent_results_are_cut_at_the_budget_together(backend: Backend) {
    let Federation { files, gw, agent } =
        Federation::start(backend, Era::Discover, all_files_config, "files__read_held").await;
    let tokens = counter();
    let each = tokens.count(&file_text("a.rs", 30));
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "read three", "budget": 2 * each + 60}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let prompt = created["budget_used"].as_u64().unwrap();
    let budget = created["budget_allocated"].as_u64().unwrap();

    let read = |path: &'static str| {
        call_in(&agent, &id, "files__read_held", json!({"path": path, "lines": 30}))
    };
    // The upstream answers once all three calls are in: all three were let
    // through by the read before the call, and are charged after it.
    let (a, b, c, ()) = tokio::join!(read("a.rs"), read("b.rs"), read("c.rs"), async {
        files.hold.arrivals(3).await;
        files.hold.release(3);
    });
    let mut shown = 0;
    let mut charged = 0;
    let mut cut = 0;
    for (result, path) in [(&a, "a.rs"), (&b, "b.rs"), (&c, "c.rs")] {
        let report = metering(result);
        charged += report["tokens_in"].as_u64().unwrap() + report["tokens_out"].as_u64().unwrap();
        // The upstream's text the agent received, without the marker.
        let texts: Vec<&str> =
            result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
        let marked = texts.last().is_some_and(|t| t.starts_with("\n[foldgate: result truncated"));
        let upstream_text = if marked { &texts[..texts.len() - 1] } else { &texts[..] };
        shown += upstream_text.iter().map(|t| tokens.count(t)).sum::<u64>();
        if report["truncated"] == true {
            cut += 1;
            assert!(marked, "a cut result says so: {result:?}");
        } else {
            assert_eq!(report["tokens_out"].as_u64().unwrap(), tokens.count(&file_text(path, 30)));
        }
    }
    assert!(cut >= 1, "three results of {each} tokens do not fit {budget}");
    assert!(shown <= budget - prompt, "the agent saw {shown} tokens of {}", budget - prompt);
    assert_eq!(charged, budget - prompt, "the calls are charged what was left");

    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(
        (status["status"].as_str(), status["reason"].as_str()),
        (Some("timeout"), Some("budget_exhausted"))
    );
    assert_eq!(status["budget_used"].as_u64().unwrap(), budget);
    assert_eq!(status["calls"]["count"], 3);
    assert_eq!(status["calls"]["truncated"], cut);
    assert_eq!(
        status["calls"]["tokens_in"].as_u64().unwrap()
            + status["calls"]["tokens_out"].as_u64().unwrap(),
        budget - prompt,
        "the trace records what the agent received"
    );

    gw.stop().await;
    files.down().await;
}

/// A branch that ends while a call in it is running (returned here; a
/// deadline or a parent's return alike) is charged nothing for it, and the
/// agent receives nothing of the result.
async fn a_result_is_withheld_when_its_branch_ended_during_the_call(backend: Backend) {
    let Federation { files, gw, agent } =
        Federation::start(backend, Era::Discover, all_files_config, "files__read_held").await;
    let created = ok(&call(
        &agent,
        "branch_create",
        json!({"session_id": "s1", "description": "slow read", "budget": 4000}),
    )
    .await);
    let id = created["branch_id"].as_str().unwrap().to_owned();
    let prompt = created["budget_used"].as_u64().unwrap();

    let args = json!({"path": "slow.rs", "lines": 30});
    let (result, returned) = tokio::join!(call_in(&agent, &id, "files__read_held", args), async {
        files.hold.arrivals(1).await;
        let returned = call(&agent, "branch_return", json!({"branch_id": id, "message": "done"}));
        let returned = ok(&returned.await);
        files.hold.release(1);
        returned
    });
    assert_eq!(returned["tokens_used"].as_u64().unwrap(), prompt + counter().count("done"));
    let text = text_of(&result);
    assert!(text.contains("[foldgate: result withheld"), "{text}");
    assert!(!text.contains("slow.rs"), "nothing of the result: {text}");
    let report = metering(&result);
    assert_eq!(
        (report["truncated"].as_bool(), report["branch_ended"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(report["tokens_out"], 0);

    let status = ok(&call(&agent, "branch_status", json!({"branch_id": id})).await);
    assert_eq!(status["status"], "completed");
    assert_eq!(status["budget_used"].as_u64().unwrap(), prompt + counter().count("done"));
    assert_eq!(status["calls"]["count"], 1);
    assert_eq!(status["calls"]["truncated"], 1);
    assert_eq!(status["calls"]["tokens_out"], 0, "recorded as received");

    gw.stop().await;
    files.down().await;
}
