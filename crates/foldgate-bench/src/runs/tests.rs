use super::*;

#[test]
fn tool_results_are_counted_in_both_formats() {
    let openai = json!({"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "tool_calls": [{"id": "call_0"}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "call_1"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "y"},
    ]});
    assert_eq!(tool_results(&openai), 2);
    let anthropic = json!({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "task"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_0"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_0"}]},
    ]});
    assert_eq!(tool_results(&anthropic), 1);
    assert_eq!(tool_results(&json!({"messages": "nope"})), 0);
}

#[test]
fn requests_name_their_run() {
    let body = json!({"messages": [{"role": "user", "content": format!("Task: {}", task(17))}]});
    assert_eq!(run_number(&body), Some(17));
    assert_eq!(run_number(&json!({"messages": [{"content": "Hold the line"}]})), None);
}

#[test]
fn the_script_calls_tools_then_answers() {
    assert!(
        matches!(answer(0, 2), Reply::ToolCalls { ref calls, .. } if calls[0].name == "echo__echo")
    );
    assert!(matches!(answer(1, 2), Reply::ToolCalls { .. }));
    assert!(matches!(answer(2, 2), Reply::Text { ref text, .. } if text == FINDING));
}

#[test]
fn pool_usage_is_read_from_metrics() {
    let text = "# HELP foldgate_db_pool_connections Database connections\n\
                foldgate_db_pool_connections{state=\"used\",otel_scope_name=\"foldgate\"} 3\n\
                foldgate_db_pool_connections{state=\"idle\",otel_scope_name=\"foldgate\"} 7\n\
                foldgate_db_pool_connections_max{otel_scope_name=\"foldgate\"} 10\n";
    assert_eq!(pool_usage(text), (Some(3), Some(10)));
    assert_eq!(pool_usage("other 1\n"), (None, None));
}

#[test]
fn store_operations_are_read_from_metrics() {
    let at = |count: f64, sum: f64| {
        format!(
            "foldgate_db_operation_duration_seconds_count{{db_operation_name=\"branch\",db_system_name=\"sqlite\"}} {count}\n\
             foldgate_db_operation_duration_seconds_sum{{db_operation_name=\"branch\",db_system_name=\"sqlite\"}} {sum}\n\
             foldgate_db_operation_duration_seconds_bucket{{db_operation_name=\"branch\",le=\"0.1\"}} {count}\n"
        )
    };
    let before = db_operations(&at(10.0, 0.01));
    assert_eq!(before["branch"], (10.0, 0.01));
    let after = db_operations(&at(30.0, 0.05));
    let delta = db_delta(&before, &after, 4);
    assert_eq!(delta["branch"].per_run, 5.0);
    assert!((delta["branch"].mean_ms - 2.0).abs() < 1e-9);
}

#[test]
fn cores_are_cpu_seconds_per_second() {
    let t0 = Instant::now();
    let at = |ms: u64, cpu: f64| (t0 + Duration::from_millis(ms), cpu);
    let series = [at(0, 0.0), at(500, 0.2), at(1000, 0.5), at(1500, 1.7), at(2000, 2.0)];
    let (mean, peak) = cores(&series);
    assert!((mean.unwrap() - 1.0).abs() < 1e-9);
    assert!((peak.unwrap() - 1.5).abs() < 1e-9, "{peak:?}");
    assert_eq!(cores(&[]), (None, None));
}
