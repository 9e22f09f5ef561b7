//! `bench/run --check` on a git repository made in a temp folder: every commit BENCHMARKS.md
//! records beside its figures is judged against HEAD (known to git, an ancestor, at most N
//! commits touching `src/` since), one line per figure block and commit, exit 1 when any fails;
//! the README's figures (the table `bench/all` writes) fail when stale, `--stale-ok` or not; the
//! stamps of RELIABILITY.md and docs/ are printed and fail nothing.
//! Needs `git` and `python3`, no build of the bench and no testbed.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=bench check",
            "-c",
            "user.email=bench@check.invalid",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Writes `path` (relative to `dir`) and commits it; returns the short commit.
fn commit(dir: &Path, path: &str, body: &str, message: &str) -> String {
    let file = dir.join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, body).unwrap();
    git(dir, &["add", path]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "--short", "HEAD"])
}

fn check(repo: &Path, max_src: &str) -> (i32, String) {
    check_with(repo, max_src, &[])
}

fn check_with(repo: &Path, max_src: &str, more: &[&str]) -> (i32, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/run");
    let out = Command::new("python3")
        .arg(script)
        .args(["--check", "--max-src-commits", max_src, "--repo"])
        .arg(repo)
        .args(more)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn bench_check_judges_every_recorded_commit_against_head() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    git(dir, &["init", "-q"]);
    let old = commit(dir, "src/a.rs", "1", "src one");
    commit(dir, "src/a.rs", "2", "src two");
    commit(dir, "src/a.rs", "3", "src three");
    let recent = commit(dir, "src/a.rs", "4", "src four");
    commit(dir, "docs.md", "not src", "docs only");
    // a commit on a side branch: known to git, not an ancestor of HEAD
    git(dir, &["checkout", "-q", "-b", "side"]);
    let side = commit(dir, "src/b.rs", "side", "side branch");
    git(dir, &["checkout", "-q", "-"]);
    commit(dir, "src/a.rs", "5", "src five");
    let unknown = "deadbee1234";
    let md = format!(
        "# Benchmarks\n\nIntro, no figures.\n\n\
         ## Recent (`bench/run`)\n\n\
         Measured at commit `{recent}` by `bench/run`, 2026-12-03 10:00 UTC.\n\n\
         | a | b |\n|---|---|\n| 1 | 2 |\n\n\
         ### Part of it, stamped above\n\n| c |\n|---|\n| 3 |\n\n\
         ## Old, in prose\n\nMeasured at commit {old} by hand.\n\n| d |\n|---|\n| 4 |\n\n\
         ## Unknown\n\nMeasured at commit `{unknown}` by `bench/watch`, 2026-12-03 10:00 UTC.\n\n\
         | e |\n|---|\n| 5 |\n\n\
         ## Side branch\n\nMeasured at commit `{side}` by `bench/weights`, 2026-12-03 10:00 UTC.\n\n\
         | f |\n|---|\n| 6 |\n\n\
         ## No commit\n\n| g |\n|---|\n| 7 |\n"
    );
    commit(dir, "BENCHMARKS.md", &md, "benchmarks");
    let readme = format!(
        "# Project\n\n<!-- figures: begin (written by bench/all) -->\n\
         | figure | measured | target | verdict | where, at |\n|---|---|---|---|---|\n\
         | a no-op plan | 1 s | 2 s | met | [BENCHMARKS.md](BENCHMARKS.md) at `{recent}`, 2026-12-03 |\n\
         <!-- figures: end -->\n"
    );
    commit(dir, "README.md", &readme, "readme");
    let stamped = |c: &str| {
        format!("# Page\n\nMeasured at commit `{c}` by `bench/chaos`, 2026-12-03 10:00 UTC.\n")
    };
    commit(dir, "RELIABILITY.md", &stamped(&old), "reliability");
    commit(dir, "docs/benchmark-history.md", &stamped(&old), "history");

    let (rc, out) = check(dir, "2");
    let lines: Vec<&str> = out.lines().collect();
    let expect = [
        format!("ok           BENCHMARKS.md:5  ## Recent (`bench/run`): commit {recent} by bench/run: 1 commit touching src/ since (at most 2)"),
        format!("ok           BENCHMARKS.md:13  ### Part of it, stamped above: commit {recent} by bench/run: 1 commit touching src/ since (at most 2)"),
        format!("STALE        BENCHMARKS.md:19  ## Old, in prose: commit {old} (legacy prose): 4 commits touching src/ since (at most 2)"),
        format!("UNKNOWN      BENCHMARKS.md:27  ## Unknown: commit {unknown} by bench/watch: not a commit of this repository"),
        format!("NOT-ANCESTOR BENCHMARKS.md:35  ## Side branch: commit {side} by bench/weights: not an ancestor of HEAD"),
        "NO-COMMIT    BENCHMARKS.md:43  ## No commit: no commit recorded: a table of figures with no commit beside it".to_string(),
    ];
    assert_eq!(
        lines[..expect.len()],
        expect.iter().map(String::as_str).collect::<Vec<_>>()[..],
        "{out}"
    );
    assert!(
        out.contains("bench/run --check: FAIL: 4 of 6 recorded commits fail"),
        "{out}"
    );
    for stale in [
        "BENCHMARKS.md:19 ## Old",
        "BENCHMARKS.md:27 ## Unknown",
        "BENCHMARKS.md:35 ## Side branch",
        "BENCHMARKS.md:43 ## No commit",
    ] {
        assert!(
            out.contains(&format!("  {stale}")),
            "{stale} listed as stale: {out}"
        );
    }
    assert_eq!(rc, 1, "{out}");
    // --stale-ok (CI's): the stale figure no longer fails, the three without a commit of this
    // history still do
    let (rc, out) = check_with(dir, "2", &["--stale-ok"]);
    assert!(
        out.contains("bench/run --check: FAIL: 3 of 6 recorded commits fail"),
        "{out}"
    );
    assert!(!out.contains("  BENCHMARKS.md:19 ## Old"), "{out}");
    assert_eq!(rc, 1, "{out}");

    // only the current figures left: the check passes; a wider bound lets the old one pass too
    let current = md.split("## Old, in prose").next().unwrap().to_string();
    commit(dir, "BENCHMARKS.md", &current, "only the current figures");
    let (rc, out) = check(dir, "2");
    assert!(
        out.contains("bench/run --check: ok: 2 recorded commits"),
        "{out}"
    );
    assert!(
        out.contains(&format!("ok           README.md:6  a no-op plan: commit {recent}: 1 commit touching src/ since (at most 2)")),
        "{out}"
    );
    // another page's stale stamp is printed and fails nothing; the history is not read
    assert!(
        out.contains(&format!("STALE        RELIABILITY.md:3  by bench/chaos: commit {old}: 4 commits touching src/ since (at most 2) (printed, not failing)")),
        "{out}"
    );
    assert!(!out.contains("benchmark-history.md"), "{out}");
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = check(dir, "0");
    assert!(out.starts_with("STALE "), "{out}");
    assert_eq!(rc, 1, "{out}");
    // --stale-ok passes BENCHMARKS.md's stale figures, not the README's
    let (rc, out) = check_with(dir, "0", &["--stale-ok"]);
    assert!(out.starts_with("STALE "), "{out}");
    assert!(out.contains("2 of them more than 0 commits"), "{out}");
    assert!(
        out.contains("STALE        README.md:6  a no-op plan")
            && out.contains("FAIL: 1 of the README's 1 figures fail"),
        "{out}"
    );
    assert_eq!(rc, 1, "{out}");
    let (rc, out) = check_with(dir, "1", &["--stale-ok"]);
    assert_eq!(rc, 0, "{out}");
    // a README without its figures fails: nothing on the front page goes unchecked
    commit(
        dir,
        "README.md",
        "# Project\n\nNo figures.\n",
        "readme without figures",
    );
    let (rc, out) = check_with(dir, "2", &["--stale-ok"]);
    assert!(
        out.contains("FAIL         README.md: no figures block"),
        "{out}"
    );
    assert_eq!(rc, 1, "{out}");
}
