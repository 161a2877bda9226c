//! How well `tool_search` finds the tool a need calls for: the catalogue's
//! 72 labelled needs over its 327 tools, as the gateway ranks them.

use foldgate_testkit::catalog;
use foldgate_upstream::search::rank;

/// Where each labelled need's tool ranks (1-based; `None`: not in the top
/// 10), printed with the misses, so that a change to the ranking shows
/// what it gains and loses.
#[test]
fn labelled_needs_find_their_tool_in_the_top_three() {
    let tools = catalog::namespaced_tools();
    let queries = catalog::queries();
    assert!(
        tools.len() >= 300 && queries.len() >= 30,
        "{} tools, {} queries",
        tools.len(),
        queries.len()
    );
    let mut ranks = Vec::new();
    for q in &queries {
        let found = rank(&tools, &q.query, 10);
        let at = found
            .iter()
            .position(|(i, _)| q.expected.iter().any(|e| e == tools[*i].name.as_ref()))
            .map(|p| p + 1);
        if at.is_none_or(|r| r > 3) {
            let top: Vec<&str> =
                found.iter().take(3).map(|(i, _)| tools[*i].name.as_ref()).collect();
            eprintln!("{:?}: expected {:?} ranks {at:?}; top 3 {top:?}", q.query, q.expected);
        }
        ranks.push(at);
    }
    let within = |k: usize| ranks.iter().filter(|r| r.is_some_and(|r| r <= k)).count();
    let n = queries.len();
    let mrr: f64 = ranks.iter().map(|r| r.map_or(0.0, |r| 1.0 / r as f64)).sum::<f64>() / n as f64;
    eprintln!(
        "{n} needs over {} tools: top 1 {}, top 3 {}, top 5 {}, top 10 {}; mean reciprocal rank {mrr:.3}",
        tools.len(),
        within(1),
        within(3),
        within(5),
        within(10),
    );
    // What the ranking achieves today (47 of 72 in the top 3, 52 in the
    // top 5): a change that finds fewer fails.
    assert!(within(3) * 100 >= n * 65, "top 3 for {} of {n}", within(3));
    assert!(within(5) * 100 >= n * 72, "top 5 for {} of {n}", within(5));
}
