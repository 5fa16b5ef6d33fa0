//! The benchmark harness itself keeps working: a smoke-sized run (tiny transfers,
//! not a measurement) of every section that needs no extra tool must print the
//! table and write JSON with every row and a finite, positive ratio.

use std::process::Command;

use thunderbolt_tests::bin_dir;

/// A smoke-sized run of `sections`: its table (stdout) and the rows it wrote as JSON.
fn smoke_run(sections: &str) -> (String, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = Command::new(bin_dir().join("bench"))
        .args(["--smoke", "--only", sections, "--json"])
        .arg(&json)
        .output()
        .expect("run bench (built by `cargo build --workspace --bins`)");
    assert!(out.status.success(), "bench failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let rows = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), rows)
}

#[test]
fn smoke_run_writes_every_row() {
    let (stdout, rows) = smoke_run("setup,bulk,small,many,memory");
    assert!(stdout.starts_with("| measure |"), "no table on stdout:\n{stdout}");

    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for want in [
        "dial → first response (direct)",
        "dial → first response (relay)",
        "bulk 1 MiB through cat agent (direct)",
        "bulk 1 MiB through cat agent (relay)",
        "~200 B request/response p50 (median of 10 blocks)",
        "~200 B request/response p99",
        "~200 B round trips per second",
        "16 concurrent sessions, aggregate",
        "bridge RSS per idle session",
    ] {
        assert!(names.contains(&want), "row '{want}' missing from {names:?}");
    }
    for r in &rows {
        let ratio = r["ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "row {} has ratio {ratio}", r["name"]);
        assert!(stdout.contains(r["name"].as_str().unwrap()), "row {} not in the table", r["name"]);
    }
}

/// The duplex section's cases, smoke-sized: JSON strings and ACP messages
/// echoed through `connect` on both protocols, every row written. A case whose
/// lines the bridge refused would come back short and fail the transfer.
#[test]
fn duplex_smoke_run_echoes_every_case() {
    let (_, rows) = smoke_run("duplex");
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    for want in [
        "~1 KiB lines echoed full duplex through connect, resumable (relays disabled)",
        "~1 KiB ACP session/update messages echoed full duplex through connect, resumable (relays disabled)",
        "the plain path against itself (relays disabled, ACP session/update messages): a second series of \
         connect --no-resume, the comparison's own spread",
    ] {
        assert!(names.contains(&want), "row '{want}' missing from {names:?}");
    }
    // Both shapes again with the CPUs split between the bridge's side and
    // the client's, where the machine has two.
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        for lines in ["~1 KiB lines", "~1 KiB ACP session/update messages"] {
            let want = format!(
                "{lines} echoed full duplex through connect, resumable (relays disabled, CPUs split: bridge and agent on "
            );
            assert!(names.iter().any(|n| n.starts_with(&want)), "no row '{want}…' in {names:?}");
        }
    }
    for r in &rows {
        let ratio = r["ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "row {} has ratio {ratio}", r["name"]);
    }
}

#[test]
fn unknown_section_is_refused() {
    let out = Command::new(bin_dir().join("bench")).args(["--only", "bulk,speed"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'speed'"), "{err}");
}
