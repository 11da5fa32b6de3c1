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

/// The results file a README's table names on its source line (`Source: bench/results/X.jsonl`).
fn sources(readme: &str) -> Vec<String> {
    readme.lines().filter_map(|l| l.strip_prefix("Source: ")).map(|l| l.split_whitespace().next().unwrap_or_default().to_string()).collect()
}

#[test]
fn readme_tables_are_report_output() {
    let tmp = std::env::temp_dir().join(format!("bsg-report-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for readme in ["README.md", "bench/README.md"] {
        let text = std::fs::read_to_string(root().join(readme)).unwrap();
        let names = sources(&text);
        assert_eq!(names.len(), 3, "{readme}: one source line per table (gemm, grouped, w4a16), found {names:?}");
        assert!(names.iter().all(|n| n == &names[0]), "{readme}: the tables name different results files: {names:?}");
        let jsonl = root().join(&names[0]);
        assert!(jsonl.is_file(), "{readme} names {}, which is not in the repository", names[0]);
        let copy = tmp.join(Path::new(readme).file_name().unwrap());
        std::fs::write(&copy, &text).unwrap();
        for table in [None, Some("--grouped"), Some("--w4a16")] {
            let mut cmd = Command::new(python());
            cmd.current_dir(root()).arg("bench/report.py").arg(&jsonl).arg("--readme").arg(&copy);
            cmd.args(table);
            let out = cmd.output().expect("python3 runs");
            assert!(out.status.success(), "report.py {table:?} on {readme}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let regenerated = std::fs::read_to_string(&copy).unwrap();
        if regenerated != text {
            let first = text.lines().zip(regenerated.lines()).position(|(a, b)| a != b).unwrap_or(0);
            panic!("{readme}: its tables differ from report.py's output for {} from line {}; regenerate them (bench/README.md, Commands)", names[0], first + 1);
        }
    }
    std::fs::remove_dir_all(&tmp).ok();
}
