//! The bench's Python scripts without a GPU: both compile, and the READMEs' speed tables are what
//! `bench/report.py` writes for the results file each table names (the tables are generated,
//! never edited by hand: bench/README.md).
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> &'static str {
    "python3"
}

#[test]
fn bench_scripts_compile() {
    for script in ["bench/baselines.py", "bench/report.py"] {
        // Compiled to a string, not to __pycache__: nothing is written into the source tree.
        let code = "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')";
        let out = Command::new(python()).args(["-c", code]).arg(root().join(script)).output().expect("python3 runs (the build needs it too)");
        assert!(out.status.success(), "{script} does not compile: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// The tags of a README's table markers (`None` for the plain `<!-- bench-table:begin -->`, else
/// the TAG of `<!-- bench-table:TAG:begin -->`), each once, and for each the results files its
/// tables name on their source lines (`Source: bench/results/X.jsonl`).
fn sources(readme: &str) -> Vec<(Option<String>, Vec<String>)> {
    let mut out: Vec<(Option<String>, Vec<String>)> = Vec::new();
    let mut current: Option<Option<String>> = None;
    for line in readme.lines().map(str::trim) {
        let marker = ["bench", "grouped", "w4a16"].iter().find_map(|t| line.strip_prefix(&format!("<!-- {t}-table"))?.strip_suffix(" -->"));
        match marker {
            Some(m) if m.ends_with(":begin") => {
                let tag = m.strip_suffix(":begin").and_then(|t| t.strip_prefix(':')).map(str::to_string);
                if !out.iter().any(|(t, _)| *t == tag) {
                    out.push((tag.clone(), Vec::new()));
                }
                current = Some(tag);
            }
            Some(_) => current = None,
            None => {
                if let (Some(tag), Some(src)) = (&current, line.strip_prefix("Source: ")) {
                    let entry = out.iter_mut().find(|(t, _)| t == tag).expect("pushed at its begin marker");
                    entry.1.push(src.split_whitespace().next().unwrap_or_default().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn readme_tables_are_report_output() {
    let tmp = std::env::temp_dir().join(format!("bsg-report-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for readme in ["README.md", "bench/README.md"] {
        let text = std::fs::read_to_string(root().join(readme)).unwrap();
        let groups = sources(&text);
        assert!(groups.iter().any(|(tag, _)| tag.is_none()), "{readme}: no untagged tables");
        let copy = tmp.join(Path::new(readme).file_name().unwrap());
        std::fs::write(&copy, &text).unwrap();
        for (tag, names) in &groups {
            assert_eq!(names.len(), 3, "{readme} {tag:?}: one source line per table (gemm, grouped, w4a16), found {names:?}");
            assert!(names.iter().all(|n| n == &names[0]), "{readme} {tag:?}: the tables name different results files: {names:?}");
            let jsonl = root().join(&names[0]);
            assert!(jsonl.is_file(), "{readme} names {}, which is not in the repository", names[0]);
            for table in [None, Some("--grouped"), Some("--w4a16")] {
                let mut cmd = Command::new(python());
                cmd.current_dir(root()).arg("bench/report.py").arg(&jsonl).arg("--readme").arg(&copy);
                cmd.args(table);
                if let Some(tag) = tag {
                    cmd.args(["--tag", tag]);
                }
                let out = cmd.output().expect("python3 runs");
                assert!(out.status.success(), "report.py {table:?} {tag:?} on {readme}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let regenerated = std::fs::read_to_string(&copy).unwrap();
        if regenerated != text {
            let first = text.lines().zip(regenerated.lines()).position(|(a, b)| a != b).unwrap_or(0);
            panic!("{readme}: its tables differ from report.py's output from line {}; regenerate them (bench/README.md, Commands)", first + 1);
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn sources_are_grouped_by_the_markers_tag() {
    let text = "<!-- bench-table:begin -->\nSource: a.jsonl (x)\n<!-- bench-table:end -->\nSource: stray.jsonl\n\
                <!-- grouped-table:h100:begin -->\nSource: b.jsonl (y)\n<!-- grouped-table:h100:end -->\n\
                <!-- w4a16-table:begin -->\nSource: a.jsonl\n<!-- w4a16-table:end -->\n";
    assert_eq!(sources(text), [(None, vec!["a.jsonl".to_string(), "a.jsonl".to_string()]), (Some("h100".to_string()), vec!["b.jsonl".to_string()])]);
}
