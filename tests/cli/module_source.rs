//! Where a module's `source` may point. Inside a git repository (a pull request's checkout) it
//! must stay in that repository, symlinks resolved, or in a folder the user names in
//! `SPARKFORM_MODULE_PATH`; anything else is refused at `validate` with its file, line and
//! column, so an unreviewed definition reads no `.hcl` file elsewhere. Outside a repository
//! nothing marks the project's bounds and a local folder is read as Terraform reads one.

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn validate(dir: &Path, module_path: Option<&Path>) -> (i32, String) {
    let mut c = Command::cargo_bin("sparkform").expect("binary");
    c.current_dir(dir)
        .args(["validate", "-no-color", "."])
        .env_remove("SPARKFORM_MODULE_PATH");
    if let Some(p) = module_path {
        c.env("SPARKFORM_MODULE_PATH", p);
    }
    let o = c.output().expect("run");
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code().unwrap_or(-1), text)
}

/// A folder of modules (`elsewhere`) beside a repository of definitions (`defs`, with a `.git`)
/// in one temp folder, and definitions that call it through `..`.
fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(
        shared.join("m.hcl"),
        "variable \"n\" {\n  default = 1\n}\noutput \"n\" {\n  value = var.n\n}\n",
    )
    .unwrap();
    let defs = tmp.path().join("defs");
    std::fs::create_dir_all(defs.join(".git")).unwrap();
    std::fs::write(
        defs.join("main.hcl"),
        "module \"m\" {\n  source = \"../elsewhere\"\n}\n",
    )
    .unwrap();
    (tmp, defs, shared)
}

#[test]
fn a_module_source_outside_the_repository_is_refused_where_it_is_written() {
    let (_tmp, defs, shared) = layout();
    let (code, text) = validate(&defs, None);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("module `m`: its source")
            && text.contains("leaves the definitions' repository")
            && text.contains("main.hcl:2:12")
            && text.contains("SPARKFORM_MODULE_PATH"),
        "{text}"
    );
    // The folder named in SPARKFORM_MODULE_PATH is allowed, and another one is not.
    let (code, text) = validate(&defs, Some(&shared));
    assert_eq!(code, 0, "{text}");
    let (code, text) = validate(&defs, Some(&defs.join("nothing-here")));
    assert_eq!(code, 1, "{text}");
}

#[test]
fn a_symlink_inside_the_repository_does_not_carry_a_module_out() {
    let (_tmp, defs, shared) = layout();
    std::os::unix::fs::symlink(&shared, defs.join("modules")).unwrap();
    std::fs::write(
        defs.join("main.hcl"),
        "module \"m\" {\n  source = \"./modules\"\n}\n",
    )
    .unwrap();
    let (code, text) = validate(&defs, None);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("leaves the definitions' repository"),
        "{text}"
    );
}

#[test]
fn outside_a_repository_or_inside_one_that_holds_both_the_module_is_read() {
    let (tmp, defs, _shared) = layout();
    // The repository holds both folders: `../elsewhere` is inside it.
    std::fs::remove_dir_all(defs.join(".git")).unwrap();
    std::fs::create_dir_all(tmp.path().join(".git")).unwrap();
    let (code, text) = validate(&defs, None);
    assert_eq!(code, 0, "{text}");
    // No repository at all (a copy of a project, a temp folder): nothing bounds it.
    std::fs::remove_dir_all(tmp.path().join(".git")).unwrap();
    let (code, text) = validate(&defs, None);
    assert_eq!(code, 0, "{text}");
}
