//! The example binary as users run it: options, safetensors in and out, every error exit, and
//! `--device cpu` against answers computed here from the file bytes, independently of the crate;
//! and the benchmark's option errors.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn exe() -> PathBuf {
    example("nvfp4_gemm")
}

/// The example `name`, built first where cargo runs this test.
fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/example_cli-<hash> -> target/<profile>/examples/<name>
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let path = deps.parent().unwrap().join("examples").join(name);
    // Recorded once built: a failed build panics before that, so later tests build again and fail
    // too rather than run a stale binary.
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == name) {
        // `cargo test` builds examples; `cargo test --test example_cli` alone does not, and would
        // run a stale binary: build it in this test binary's profile (a no-op when up to date).
        // Cargo sets CARGO for the tests it runs; a test binary run by hand (the GPU bundle, which
        // ships the example beside it and has no cargo) uses the binary it finds.
        let Some(cargo) = std::env::var_os("CARGO") else {
            assert!(path.is_file(), "{} is missing: run through cargo, or build the example", path.display());
            built.push(name.to_string());
            return path;
        };
        // target[/<triple>]/<profile dir>/deps: build into the same folder, in the profile that
        // built this binary (`cargo test` builds in the test profile, whose folder is "debug", and
        // the example with it; a target triple adds a level).
        let profile_dir = deps.parent().unwrap();
        let profile = match profile_dir.file_name().and_then(|p| p.to_str()) {
            Some("debug") | None => "test".to_string(),
            Some(p) => p.to_string(),
        };
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "--example", name, "--profile", &profile]).current_dir(env!("CARGO_MANIFEST_DIR"));
        let above = profile_dir.parent().unwrap();
        if above.file_name() != Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().file_name() {
            cmd.args(["--target", above.file_name().unwrap().to_str().unwrap()]);
        }
        let status = cmd.status().unwrap_or_else(|e| panic!("running {cargo:?} (CARGO) to build the example: {e}"));
        assert!(status.success(), "building the example {name} failed");
        built.push(name.to_string());
    }
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(exe()).args(args).output().expect("run the example (cargo test builds it)")
}

/// Runs the example and asserts it exits 0, with its stderr where it does not.
#[track_caller]
fn run_ok(args: &[&str]) -> Output {
    let o = run(args);
    assert_eq!(code(&o), 0, "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    o
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn stderr_one_line(o: &Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(e.trim_end().lines().count(), 1, "expected one line on stderr, got {e:?}");
    e
}

/// A path for a file in Cargo's scratch folder for integration tests (under the target folder, so
/// runs leave nothing in the system's temporary folder), in a folder of this process (runs at once
/// do not share files), with nothing there yet: a test that reads back what the CLI saved never
/// reads an earlier run's file.
fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("example_cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn write(path: &PathBuf, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// e2m1 and e4m3 decoded by table and bit formula, and the tiled scale offset, written out here.
fn e2m1(c: u8) -> f64 {
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][(c & 7) as usize] * if c & 8 != 0 { -1.0 } else { 1.0 }
}
fn e4m3(b: u8) -> f64 {
    let (e, m) = ((b >> 3) & 15, (b & 7) as f64);
    if e == 0 { m * 2f64.powi(-9) } else { (1.0 + m / 8.0) * 2f64.powi(e as i32 - 7) }
}
fn sf_off(r: usize, s: usize, sp: usize) -> usize {
    (r / 128) * (sp / 4) * 512 + (s / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (s % 4)
}

/// D from the bytes of a file, in f64: alpha * sum a*sfa*b*sfb + beta * c.
fn independent(st: &SafeTensors, m: usize, n: usize, k: usize, l: usize, alpha: f64, beta: f64) -> Vec<f64> {
    let (a, sfa) = (st.tensor("a").unwrap(), st.tensor("sfa").unwrap());
    let sp = (k / 16).div_ceil(4) * 4;
    let pa = m.div_ceil(128) * 128 * sp;
    let a_val = |li: usize, r: usize, kk: usize| {
        let byte = a.data()[((li * m + r) * k + kk) / 2];
        e2m1(if kk.is_multiple_of(2) { byte & 15 } else { byte >> 4 }) * e4m3(sfa.data()[li * pa + sf_off(r, kk / 16, sp)])
    };
    independent_with(st, m, n, k, l, alpha, beta, &a_val)
}

/// D in f64 from the saved B (packed e2m1 and tiled scales), C where present, and A's values as
/// `a_val(batch, row, k)` gives them.
#[allow(clippy::too_many_arguments)]
fn independent_with(st: &SafeTensors, m: usize, n: usize, k: usize, l: usize, alpha: f64, beta: f64, a_val: &dyn Fn(usize, usize, usize) -> f64) -> Vec<f64> {
    let (b, sfb) = (st.tensor("b").unwrap(), st.tensor("sfb").unwrap());
    let c = st.tensor("c").ok().map(|c| match c.dtype() {
        Dtype::F32 => c.data().chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().unwrap()) as f64).collect::<Vec<_>>(),
        _ => c.data().chunks_exact(2).map(|x| half::f16::from_le_bytes([x[0], x[1]]).to_f64()).collect(),
    });
    let sp = (k / 16).div_ceil(4) * 4;
    let pb = n.div_ceil(128) * 128 * sp;
    let val = |data: &[u8], sf: &[u8], per: usize, rows: usize, li: usize, r: usize, kk: usize| {
        let byte = data[((li * rows + r) * k + kk) / 2];
        e2m1(if kk.is_multiple_of(2) { byte & 15 } else { byte >> 4 }) * e4m3(sf[li * per + sf_off(r, kk / 16, sp)])
    };
    let mut d = vec![0.0; l * m * n];
    for li in 0..l {
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|kk| a_val(li, i, kk) * val(b.data(), sfb.data(), pb, n, li, j, kk)).sum();
                let cv = c.as_ref().map_or(0.0, |c| c[(li * m + i) * n + j]);
                d[(li * m + i) * n + j] = alpha * s + if beta != 0.0 { beta * cv } else { 0.0 };
            }
        }
    }
    d
}

fn f16s(t: &TensorView<'_>) -> Vec<f64> {
    t.data().chunks_exact(2).map(|x| half::f16::from_le_bytes([x[0], x[1]]).to_f64()).collect()
}

#[test]
fn options_parse_and_bad_values_exit_2() {
    let o = run_ok(&["--help"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("--device"));
    for args in [&["--config", "nope", "--device", "cpu"][..], &["--k", "48", "--device", "cpu"], &["--input", "/nonexistent.safetensors", "--device", "cpu"]] {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let e = stderr_one_line(&o);
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
    // The CPU keeps the GPU's rule, and the help says so.
    for k in ["16", "48"] {
        refused(&["--k", k, "--device", "cpu", "--m", "8", "--n", "16"], &format!("K = {k}: must be a multiple of 32"));
    }
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).to_string();
    let k_help = help.split("--k <K>").nth(1).and_then(|h| h.split("--l <L>").next()).unwrap_or_default().to_string();
    assert!(k_help.contains("multiple of 32") && !k_help.contains("16"), "--k's help: {k_help}");
    refused(&["--prepack", "--device", "cpu"], "--prepack: the GPU's weight layout");
}

/// Option errors: clap's whole message (what is missing, the possible values), exit 2; negative
/// numbers reach the program's own rules instead of reading as unknown options.
#[test]
fn option_errors_say_what_is_wrong() {
    let cases: [(&[&str], &[&str]); 9] = [
        (&["--bogus"], &["--bogus"]),
        (&["--out", "f64"], &["f64", "possible values", "nvfp4-ue8m0"]),
        (&["--device", "tpu"], &["tpu", "possible values", "cpu"]),
        (&["--m", "x"], &["'x'", "--m"]),
        (&["--device", "cpu", "--layer", "l"], &["required", "--checkpoint"]),
        (&["--device", "cpu", "--tolerance", "loose"], &["loose", "possible values", "contest"]),
        (&["--device", "cpu", "--m", "-1"], &["'-1'", "--m"]),
        (&["--device", "cpu", "--check-budget", "-5"], &["'-5'", "--check-budget"]),
        (&["--device", "cpu", "--iterations", "0"], &["'0'", "--iterations", "must be at least 1"]),
    ];
    for (args, says) in cases {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(e.starts_with("error:") && !e.contains("panicked"), "{args:?}: {e}");
        // A negative number is a value, not an option.
        assert!(!(args.iter().any(|a| a.starts_with("-") && a[1..].starts_with(|c: char| c.is_ascii_digit())) && e.contains("unexpected argument")), "{args:?}: {e}");
        for w in says {
            assert!(e.contains(w), "{args:?}: no {w:?} in {e}");
        }
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    // A negative norm constant is the library's to refuse, by its rule.
    refused(&["--device", "cpu", "--out", "nvfp4", "--m", "8", "--n", "32", "--k", "64", "--norm-constant", "-1"], "norm_constant = -1: must be finite and greater than 0");
}

/// The benchmark checks every option value at startup, before it touches a GPU or spends minutes on
/// the runs before the bad one: exit 2, clap's message naming the option and the value.
#[test]
fn bench_option_errors_exit_2_at_startup() {
    let cases: [(&[&str], &[&str]); 11] = [
        (&["--config", "nope"], &["'nope'", "--config", "Sm90_Swapped_64x128x64"]),
        (&["--grouped-config", "Sm90_x"], &["'Sm90_x'", "--grouped-config"]),
        (&["--out", "f16,f8"], &["f8", "--out", "nvfp4-ue8m0"]),
        (&["--out", ""], &["--out", "at least one"]),
        (&["--shape", "1x2"], &["'1x2'", "--shape", "MxNxK"]),
        (&["--shape", "1x2x3x4"], &["'1x2x3x4'", "MxNxK"]),
        (&["--shape", "8x16x64", "--shape", "8xax64"], &["'8xax64'", "MxNxK"]),
        (&["--w4a16-input", "bf16,f32"], &["f32", "--w4a16-input", "bf16 or f16"]),
        (&["--quantize-rows", "1,x"], &["x is not a row count", "--quantize-rows"]),
        (&["--swiglu-rows=-1"], &["-1 is not a row count", "--swiglu-rows"]),
        (&["--data", "zeros"], &["zeros", "possible values", "gaussian"]),
    ];
    for (args, says) in cases {
        let o = Command::new(example("bench")).args(args).output().expect("run the bench example");
        assert_eq!(code(&o), 2, "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
        let e = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(e.starts_with("error:") && !e.contains("panicked"), "{args:?}: {e}");
        for w in says {
            assert!(e.contains(w), "{args:?}: no {w:?} in {e}");
        }
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    // Valid values pass (`--emit-grouped-cases` writes the cases and exits, GPU or not).
    let cases = tmp("bench-cases.json");
    let o = Command::new(example("bench"))
        .args(["--config", "Sm90_Swapped_64x128x64", "--grouped-config", "Sm90_Stream_8x128x64", "--out", "f16,nvfp4", "--shape", "8x16x64", "--quantize-rows="])
        .args(["--swiglu-rows", "1, 16", "--w4a16-input", "bf16,f16", "--grouped", "g2-n3072-k4096", "--emit-grouped-cases"])
        .arg(&cases)
        .output()
        .expect("run the bench example");
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&cases).unwrap().contains("g2-n3072-k4096"));
}

/// Without a usable GPU the default (GPU) run exits 3 with one line naming the hardware; with one,
/// it verifies a small GEMM and exits 0, naming the criterion of `--tolerance` in the verdict.
#[test]
fn gpu_run_or_exit_3_naming_the_hardware() {
    let o = run(&["--m", "128", "--n", "128", "--k", "64"]);
    match code(&o) {
        3 => {
            assert!(stderr_one_line(&o).contains("compute capability"), "{}", String::from_utf8_lossy(&o.stderr));
            // Only where the library itself finds no device it can run on.
            let usable = blockscaled_gemm::BlockScaledGemm::driver_present()
                && cudarc::driver::CudaContext::new(0).is_ok_and(|ctx| blockscaled_gemm::BlockScaledGemm::new(ctx.default_stream()).is_ok());
            assert!(!usable, "exit 3 although BlockScaledGemm::new accepts device 0");
        }
        0 => {
            assert!(blockscaled_gemm::BlockScaledGemm::driver_present(), "exit 0 without a driver");
            assert!(String::from_utf8_lossy(&o.stdout).contains("Disposition: Passed"));
            // The verdict names the criterion it applied.
            for (t, says) in [("bound", "exact or within the FP32 bound"), ("contest", "contest tolerance")] {
                let o = run(&["--m", "128", "--n", "128", "--k", "64", "--tolerance", t]);
                let out = String::from_utf8_lossy(&o.stdout);
                assert!(code(&o) == 0 && out.contains(says), "--tolerance {t}: exit {}, the report does not say \"{says}\": {out}", code(&o));
            }
            // Prepacked weights on the device that ran it: the same verdict (Hopper), or the
            // typed refusal naming the layout (SM100), in each mode.
            for args in [&["--prepack"][..], &["--prepack", "--mode", "w4a16"], &["--prepack", "--out", "nvfp4"]] {
                let o = run(&[&["--m", "33", "--n", "256", "--k", "1088"][..], args].concat());
                match code(&o) {
                    0 => assert!(String::from_utf8_lossy(&o.stdout).contains("Disposition: Passed"), "{args:?}"),
                    c => assert!(stderr_one_line(&o).contains("prepacked"), "{args:?}: exit {c}: {}", String::from_utf8_lossy(&o.stderr)),
                }
            }
        }
        c => panic!("exit {c}: {}", String::from_utf8_lossy(&o.stderr)),
    }
}

#[test]
fn generated_round_trip_matches_independent_math() {
    // L = 2, alpha != 1, beta with a generated C, M and N not multiples of 128.
    let (m, n, k, l) = (130, 72, 96, 2);
    let f1 = tmp("gen.safetensors");
    let o = run_ok(&["--device", "cpu", "--m", &m.to_string(), "--n", &n.to_string(), "--k", &k.to_string(), "--l", "2", "--alpha", "0.75", "--beta", "-1.5", "--seed", "9", "--save", f1.to_str().unwrap(), "--json"]);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("{\"m\":130,"));
    let bytes = std::fs::read(&f1).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("a").unwrap().shape(), &[l, m, k / 2]);
    assert_eq!(st.tensor("d").unwrap().shape(), &[l, m, n]);
    let want = independent(&st, m, n, k, l, 0.75, -1.5);
    let got = f16s(&st.tensor("d").unwrap());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(*g, half::f16::from_f64(*w).to_f64(), "element {i}: got {g}, exact {w}");
    }
    // Reading the file back reproduces d.
    let f2 = tmp("again.safetensors");
    run_ok(&["--device", "cpu", "--input", f1.to_str().unwrap(), "--alpha", "0.75", "--beta", "-1.5", "--save", f2.to_str().unwrap()]);
    let bytes2 = std::fs::read(&f2).unwrap();
    let st2 = SafeTensors::deserialize(&bytes2).unwrap();
    assert_eq!(st2.tensor("d").unwrap().data(), st.tensor("d").unwrap().data());
    assert!(st2.tensor("a").is_err(), "inputs are saved only when generated");
}

#[test]
fn hand_made_file_with_a_worked_answer() {
    // M = 2, N = 4, K = 32. Row 0 of A: 1.0 everywhere (code 2), scales 2 and 0.5. Row 1: -6
    // (code 15) in element 0 only, scale 448. Row 0 of B: 0.5 everywhere (code 1), scales 1 and
    // 4; rows 1 to 3 zero. D[0, 0] = 16*1*2*0.5*1 + 16*1*0.5*0.5*4 = 16 + 16 = 32;
    // D[1, 0] = -6*448*0.5*1 = -1344; the other columns 0.
    let (m, n, k) = (2usize, 4usize, 32usize);
    let mut a = vec![0x22u8; 16];
    a.extend(std::iter::once(0x0Fu8).chain(std::iter::repeat_n(0, 15)));
    let mut b = vec![0x11u8; 16];
    b.resize(n * k / 2, 0);
    let mut sfa = vec![0u8; 512];
    let mut sfb = vec![0u8; 512];
    sfa[sf_off(0, 0, 4)] = 0x40; // 2.0
    sfa[sf_off(0, 1, 4)] = 0x30; // 0.5
    sfa[sf_off(1, 0, 4)] = 0x7E; // 448
    sfb[sf_off(0, 0, 4)] = 0x38; // 1.0
    sfb[sf_off(0, 1, 4)] = 0x48; // 4.0
    let f = tmp("hand.safetensors");
    write(&f, &[("a", Dtype::U8, vec![m, k / 2], a), ("b", Dtype::U8, vec![n, k / 2], b), ("sfa", Dtype::F8_E4M3, vec![512], sfa), ("sfb", Dtype::U8, vec![32, 4, 1, 4, 1, 1], sfb)]);
    let out = tmp("hand-d.safetensors");
    run_ok(&["--device", "cpu", "--input", f.to_str().unwrap(), "--out", "f32", "--save", out.to_str().unwrap()]);
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let d = st.tensor("d").unwrap();
    assert_eq!(d.dtype(), Dtype::F32);
    assert_eq!(d.shape(), &[2, 4]);
    let v: Vec<f32> = d.data().chunks_exact(4).map(|x| f32::from_le_bytes(x.try_into().unwrap())).collect();
    assert_eq!(v, vec![32.0, 0.0, 0.0, 0.0, -1344.0, 0.0, 0.0, 0.0]);
    // N = 1 breaks the kernels' 16-byte rows of D: refused on the CPU as on the GPU.
    let one = tmp("hand-n1.safetensors");
    write(&one, &[("a", Dtype::U8, vec![m, k / 2], st_a(&f)), ("b", Dtype::U8, vec![1, k / 2], vec![0x11; 16]), ("sfa", Dtype::F8_E4M3, vec![512], vec![0x38; 512]), ("sfb", Dtype::U8, vec![512], vec![0x38; 512])]);
    let o = run(&["--device", "cpu", "--input", one.to_str().unwrap(), "--out", "f32"]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("N = 1: must be a multiple of 4 for f32"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The `a` tensor's bytes of a file.
fn st_a(path: &PathBuf) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    SafeTensors::deserialize(&bytes).unwrap().tensor("a").unwrap().data().to_vec()
}

#[test]
fn bad_files_exit_2_with_one_line() {
    let k = 64;
    let good = |name: &str| -> (&'static str, Dtype, Vec<usize>, Vec<u8>) {
        match name {
            "a" => ("a", Dtype::U8, vec![4, k / 2], vec![0x22; 4 * k / 2]),
            "b" => ("b", Dtype::U8, vec![8, k / 2], vec![0x11; 8 * k / 2]),
            "sfa" => ("sfa", Dtype::U8, vec![512], vec![0x38; 512]),
            _ => ("sfb", Dtype::U8, vec![512], vec![0x38; 512]),
        }
    };
    let cases: Vec<(&str, Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>, &str)> = vec![
        ("missing sfb", vec![good("a"), good("b"), good("sfa")], "no tensor `sfb`"),
        ("wrong dtype", vec![("a", Dtype::F32, vec![4, k / 8], vec![0; 4 * k / 2]), good("b"), good("sfa"), good("sfb")], "a: dtype F32"),
        ("wrong rank", vec![("a", Dtype::U8, vec![4 * k / 2], vec![0; 4 * k / 2]), good("b"), good("sfa"), good("sfb")], "a: shape"),
        ("K disagrees", vec![good("a"), ("b", Dtype::U8, vec![8, k], vec![0; 8 * k]), good("sfa"), good("sfb")], "L and K must agree"),
        ("scale size", vec![good("a"), good("b"), ("sfa", Dtype::U8, vec![511], vec![0; 511]), good("sfb")], "sfa: shape [511]"),
        ("K not /32", vec![("a", Dtype::U8, vec![4, 24], vec![0; 96]), ("b", Dtype::U8, vec![8, 24], vec![0; 192]), good("sfa"), good("sfb")], "K = 48"),
        ("c shape", vec![good("a"), good("b"), good("sfa"), good("sfb"), ("c", Dtype::F16, vec![4, 4], vec![0; 32])], "c: F16 [4, 4]"),
        ("negative scale", vec![good("a"), good("b"), ("sfa", Dtype::U8, vec![512], vec![0x80; 512]), good("sfb")], "sfa: byte 0x80 at offset 0 has the sign bit"),
        ("negative B scale", vec![good("a"), good("b"), good("sfa"), ("sfb", Dtype::U8, vec![512], vec![0x88; 512])], "sfb: byte 0x88 at offset 0 has the sign bit"),
        ("NaN scale padding", vec![good("a"), good("b"), good("sfa"), ("sfb", Dtype::U8, vec![512], vec![0x7F; 512])], "sfb: padding byte"),
        ("bad global scale", vec![good("a"), good("b"), good("sfa"), good("sfb"), ("global_scale_a", Dtype::F32, vec![], (-1f32).to_le_bytes().to_vec())], "global_scale_a: -1: a global scale must be finite and positive"),
        ("global scale shape", vec![good("a"), good("b"), good("sfa"), good("sfb"), ("global_scale_b", Dtype::F32, vec![2], vec![0; 8])], "global_scale_b: F32 [2], expected F32 [] or [1]"),
    ];
    for (what, tensors, msg) in cases {
        let f = tmp(&format!("bad-{}.safetensors", what.replace([' ', '/'], "-")));
        write(&f, &tensors);
        let beta = if tensors.iter().any(|t| t.0 == "c") { "1" } else { "0" };
        let o = run(&["--device", "cpu", "--input", f.to_str().unwrap(), "--beta", beta]);
        assert_eq!(code(&o), 2, "{what}: {}", String::from_utf8_lossy(&o.stderr));
        let e = stderr_one_line(&o);
        assert!(e.contains(msg), "{what}: {e}");
    }
    let junk = tmp("junk.safetensors");
    std::fs::write(&junk, b"not a safetensors file").unwrap();
    let o = run(&["--device", "cpu", "--input", junk.to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("not a safetensors file"));
}

/// `--out nvfp4` on the CPU: D (packed e2m1) and SFD (ue4m3, tiled) saved; decoded back with
/// the norm constant they approximate the exact product within FP4's rounding, computed here
/// from the file bytes; bad norm constants and N exit 2.
#[test]
fn fp4_output_saved_and_close_to_independent_math() {
    let (m, n, k) = (130, 64, 96);
    let st = 0.5f64; // scale factors max|D| / 12 stay inside ue4m3 for this data
    let f = tmp("fp4.safetensors");
    run_ok(&["--device", "cpu", "--out", "nvfp4", "--norm-constant", "0.5", "--m", &m.to_string(), "--n", &n.to_string(), "--k", &k.to_string(), "--seed", "4", "--save", f.to_str().unwrap()]);
    let bytes = std::fs::read(&f).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (d, sfd) = (file.tensor("d").unwrap(), file.tensor("sfd").unwrap());
    assert_eq!((d.dtype(), d.shape()), (Dtype::U8, &[m, n / 2][..]));
    assert_eq!((sfd.dtype(), sfd.shape()), (Dtype::F8_E4M3, &[m.div_ceil(128) * 128 * 4][..]));
    let want = independent(&file, m, n, k, 1, 1.0, 0.0);
    let mut nonzero = 0;
    for r in 0..m {
        for j in 0..n {
            let code = d.data()[(r * n + j) / 2] >> (4 * (j % 2)) & 15;
            let scale = e4m3(sfd.data()[sf_off(r, j / 16, 4)]) / st;
            let got = e2m1(code) * scale;
            // Half the widest e2m1 step (4 -> 6) plus ue4m3's rounding of the scale at the top.
            assert!((got - want[r * n + j]).abs() <= 1.5 * scale, "({r}, {j}): {got} vs exact {}", want[r * n + j]);
            nonzero += usize::from(code & 7 != 0);
        }
    }
    assert!(nonzero > m * n / 2, "most codes must be nonzero: {nonzero}");
    for (args, msg) in [(&["--norm-constant", "0"][..], "norm_constant = 0"), (&["--norm-constant", "inf"][..], "norm_constant = inf"), (&["--n", "48"][..], "N = 48: must be a multiple of 32 for nvfp4")] {
        let mut all = vec!["--device", "cpu", "--out", "nvfp4", "--m", "8", "--k", "64"];
        all.extend_from_slice(args);
        let o = run(&all);
        assert_eq!(code(&o), 2, "{all:?}");
        assert!(stderr_one_line(&o).contains(msg), "{all:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// Runs `args` and expects exit 2 with one line on stderr containing `msg`, quickly and without
/// a panic or an abort.
fn refused(args: &[&str], msg: &str) {
    let t = std::time::Instant::now();
    let o = run(args);
    assert_eq!(code(&o), 2, "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    let e = stderr_one_line(&o);
    assert!(e.contains(msg) && !e.contains("panicked"), "{args:?}: {e}");
    assert!(o.stdout.is_empty(), "{args:?}: {}", String::from_utf8_lossy(&o.stdout));
    assert!(t.elapsed().as_secs() < 20, "{args:?} took {:?}: sizes must be refused before any data is made", t.elapsed());
}

/// Issue 25, finding 2: sizes are validated before data is generated (a 48 GB allocation aborted,
/// a capacity overflow panicked), on the GPU path too.
#[test]
fn bad_sizes_exit_2_before_any_data_is_made() {
    refused(&["--m", "3000000000", "--n", "8", "--k", "32"], "M = 3000000000: must be at least 1 and at most 2147483647");
    refused(&["--m", "4611686018427387904", "--n", "8", "--k", "32", "--device", "cpu"], "M = 4611686018427387904");
    refused(&["--m", "8", "--n", "2147483584", "--k", "32", "--device", "cpu"], "N rounded up");
    refused(&["--m", "8", "--n", "8", "--k", "32", "--l", "0", "--device", "cpu"], "L = 0");
    // Valid for the kernels, far beyond this host's memory: refused, not aborted.
    refused(&["--m", "2147483392", "--n", "8", "--k", "2147483392", "--device", "cpu"], "GiB");
    refused(&["--m", "2147483392", "--n", "8", "--k", "2147483392", "--device", "cpu", "--data", "realistic"], "GiB");
}

/// Issue 25, finding 3: verification samples rows without panicking at M = 1.
#[test]
fn m_1_samples_one_row() {
    for out in ["nvfp4", "nvfp4-ue8m0"] {
        run_ok(&["--device", "cpu", "--out", out, "--m", "1", "--n", "64", "--k", "64", "--check-budget", "100"]);
    }
}

/// Issue 25, finding 8: `--device cpu` validates as the GPU path does, and JSON output never
/// holds NaN or infinity.
#[test]
fn cpu_validates_like_the_gpu_and_prints_valid_json() {
    refused(&["--device", "cpu", "--alpha", "NaN", "--json"], "alpha = NaN: must be finite");
    refused(&["--device", "cpu", "--beta", "inf", "--json"], "beta = inf: must be finite");
    // N = 12 with f16 output: the same refusal, with the same message, on either device (the
    // GPU path validates before it looks for a GPU).
    for device in ["cpu", "gpu"] {
        refused(&["--device", device, "--m", "16", "--n", "12", "--k", "64"], "N = 12: must be a multiple of 8 for f16 output");
    }
    for args in [&["--alpha", "1e-39"][..], &["--alpha", "-3e38", "--out", "f32"], &["--out", "nvfp4", "--norm-constant", "1e-30"]] {
        let mut all = vec!["--device", "cpu", "--m", "8", "--n", "32", "--k", "64", "--json"];
        all.extend_from_slice(args);
        let o = run_ok(&all);
        let line = String::from_utf8_lossy(&o.stdout).to_string();
        assert_eq!(line.trim_end().lines().count(), 1, "{line}");
        assert!(line.starts_with('{') && line.trim_end().ends_with('}'), "{line}");
        for token in ["NaN", "nan", "inf"] {
            assert!(!line.contains(token), "{all:?}: {token} in {line}");
        }
        assert!(line.contains("\"passed\":null") && line.contains("\"device\":\"cpu\""), "{line}");
    }
}

/// Issue 25, finding 9: with a tiny alpha the default norm constant cannot be formed; the user is
/// told to pass one, not that a value they never gave is bad.
#[test]
fn tiny_alpha_asks_for_a_norm_constant() {
    let base = ["--device", "cpu", "--out", "nvfp4", "--m", "8", "--n", "32", "--k", "64"];
    let mut args = base.to_vec();
    args.extend(["--alpha", "1e-39"]);
    refused(&args, "pass --norm-constant");
    let e = String::from_utf8_lossy(&run(&args).stderr).to_string();
    assert!(e.contains("alpha = 1e-39"), "{e}");
    assert!(!e.contains("norm_constant = inf"), "{e}");
    args.extend(["--norm-constant", "1e30"]);
    run_ok(&args);
}

#[test]
fn tolerance_option() {
    // Parsed on the CPU, where nothing is verified (the GPU run's verdict names the criterion:
    // gpu_run_or_exit_3_naming_the_hardware).
    for t in ["bound", "contest"] {
        let o = run_ok(&["--device", "cpu", "--m", "8", "--n", "16", "--k", "64", "--tolerance", t]);
        assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to verify"), "{t}");
    }
    let o = run(&["--device", "cpu", "--tolerance", "loose"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("possible values"));
}

/// A ModelOpt layer `l` of N x K with row-major scales, written to `path`; `edit` changes the
/// tensors first.
fn modelopt_file(path: &PathBuf, n: usize, k: usize, edit: impl Fn(&mut Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>)) {
    let codes: Vec<u8> = (0..n * k / 2).map(|i| ((i * 7 + 3) % 256) as u8).collect();
    let scales: Vec<u8> = (0..n * k / 16).map(|i| 0x30 + (i % 9) as u8).collect();
    let mut t = vec![
        ("l.weight", Dtype::U8, vec![n, k / 2], codes),
        ("l.weight_scale", Dtype::F8_E4M3, vec![n, k / 16], scales),
        ("l.weight_scale_2", Dtype::F32, vec![], 0.01f32.to_le_bytes().to_vec()),
        ("l.input_scale", Dtype::F32, vec![], (4.0f32 / 2688.0).to_le_bytes().to_vec()),
    ];
    edit(&mut t);
    write(path, &t);
}

#[test]
fn checkpoint_layer_runs_and_saves_what_it_ran() {
    let (n, k, m) = (64, 256, 5);
    let ck = tmp("ck-good.safetensors");
    modelopt_file(&ck, n, k, |_| {});
    let out = tmp("ck-out.safetensors");
    run_ok(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", &m.to_string(), "--out", "f32", "--mode", "nvfp4", "--save", out.to_str().unwrap()]);
    // D against this file's own math: the saved a, sfa, b, sfb and global scales, decoded here.
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let b_saved = st.tensor("b").unwrap();
    let ck_bytes = std::fs::read(&ck).unwrap();
    let ck_st = SafeTensors::deserialize(&ck_bytes).unwrap();
    assert_eq!(b_saved.data(), ck_st.tensor("l.weight").unwrap().data(), "B is the checkpoint's codes");
    let scalar = |name: &str| f32::from_le_bytes(st.tensor(name).unwrap().data().try_into().unwrap()) as f64;
    assert_eq!(scalar("global_scale_b"), 0.01f32 as f64);
    assert_eq!(scalar("global_scale_a"), (4.0f32 / 2688.0) as f64, "A quantized with the layer's input scale");
    assert_eq!(st.tensor("x").unwrap().shape(), &[m, k]);
    let want = independent(&st, m, n, k, 1, scalar("global_scale_a") * scalar("global_scale_b"), 0.0);
    let d = st.tensor("d").unwrap();
    let got: Vec<f64> = d.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-30), "d[{i}] = {g}, independent {w}");
    }
}

/// W4A16, the default with --checkpoint: the bf16 activations as they are times the layer's
/// weights; D against this file's own decode of the saved x, b, sfb and global scale.
#[test]
fn checkpoint_layer_w4a16_by_default() {
    let (n, k, m) = (64, 256, 5);
    let ck = tmp("ck-w4a16.safetensors");
    modelopt_file(&ck, n, k, |_| {});
    let out = tmp("ck-w4a16-out.safetensors");
    run_ok(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", &m.to_string(), "--out", "f32", "--alpha", "0.5", "--save", out.to_str().unwrap()]);
    let bytes = std::fs::read(&out).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert!(st.tensor("a").is_err() && st.tensor("sfa").is_err(), "W4A16 saves no NVFP4 A");
    let g = f32::from_le_bytes(st.tensor("global_scale_b").unwrap().data().try_into().unwrap());
    assert_eq!(g, 0.01f32);
    let x: Vec<f64> = st.tensor("x").unwrap().data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect();
    assert_eq!(x.len(), m * k);
    let want = independent_with(&st, m, n, k, 1, (0.5f32 * g) as f64, 0.0, &|_, r, kk| x[r * k + kk]);
    let got: Vec<f64> = st.tensor("d").unwrap().data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1e-30), "d[{i}] = {g}, independent {w}");
    }
    // FP4 output is NVFP4 x NVFP4 only.
    let o = run(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "2", "--out", "nvfp4"]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("--mode w4a16"));
}

#[test]
fn bad_checkpoints_exit_2_naming_the_tensor() {
    let cases: [(&str, &dyn Fn(&mut Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>), &str); 4] = [
        ("ck-nan.safetensors", &|t| t[1].3[3] = 0x7F, "l.weight_scale: element 3"),
        ("ck-missing.safetensors", &|t| t.retain(|x| x.0 != "l.weight_scale_2"), "l.weight_scale_2: not in"),
        ("ck-dtype.safetensors", &|t| t[0].1 = Dtype::I8, "l.weight: dtype I8"),
        ("ck-neg.safetensors", &|t| t[2].3 = (-1.0f32).to_le_bytes().to_vec(), "l.weight_scale_2: -1"),
    ];
    for (file, edit, want) in cases {
        let ck = tmp(file);
        modelopt_file(&ck, 32, 64, edit);
        let o = run(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "2"]);
        assert_eq!(code(&o), 2, "{file}");
        let e = stderr_one_line(&o);
        assert!(e.contains(want), "{file}: {e}");
    }
    let ck = tmp("ck-nolayer.safetensors");
    modelopt_file(&ck, 32, 64, |_| {});
    let o = run(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--m", "2"]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("--checkpoint needs --layer"));
    let o = run(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "other", "--m", "2"]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("other.weight: not in"));
    // Rows whose activations would not fit in memory: refused before any is made.
    let o = run(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "2000000000"]);
    assert_eq!(code(&o), 2);
    assert!(stderr_one_line(&o).contains("host buffers need"));
    // --layer alone, or with --input: refused by the option rules, naming what is missing.
    let o = run(&["--device", "cpu", "--layer", "l"]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--checkpoint"));
}

/// The D an FP4 file decodes to, `e2m1 * sfd / norm_constant` per element (ue4m3 SFD), with the
/// norm constant the file itself stores, and that constant.
fn fp4_decoded(st: &SafeTensors, m: usize, n: usize) -> (Vec<(f64, f64)>, f64) {
    let (d, sfd) = (st.tensor("d").unwrap(), st.tensor("sfd").unwrap());
    let norm = st.tensor("norm_constant").unwrap();
    assert_eq!((norm.dtype(), norm.shape()), (Dtype::F32, &[][..]));
    let norm = f32::from_le_bytes(norm.data().try_into().unwrap()) as f64;
    let sp = (n / 16).div_ceil(4) * 4;
    let v = (0..m * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            let code = d.data()[i / 2] >> (4 * (j % 2)) & 15;
            let scale = e4m3(sfd.data()[sf_off(r, j / 16, sp)]) / norm;
            (e2m1(code) * scale, scale)
        })
        .collect();
    (v, norm)
}

/// Probe finding: an --input file's shapes can describe a D far beyond memory (a few MiB of A
/// and B, M = N = 2^18, K = 32): refused as generated runs are, before D is allocated.
#[test]
fn input_files_are_checked_against_host_memory() {
    let rows = 1usize << 18;
    let sf = vec![0x38u8; rows * 4];
    let f = tmp("huge-d.safetensors");
    write(&f, &[("a", Dtype::U8, vec![rows, 16], vec![0x22; rows * 16]), ("b", Dtype::U8, vec![rows, 16], vec![0x22; rows * 16]), ("sfa", Dtype::U8, vec![sf.len()], sf.clone()), ("sfb", Dtype::U8, vec![sf.len()], sf)]);
    for out in ["f16", "nvfp4"] {
        refused(&["--device", "cpu", "--input", f.to_str().unwrap(), "--out", out], "the host buffers need about");
    }
}

/// The CPU reference's own buffers count: W4A16 keeps two f64 sums an output (16 bytes against
/// bf16 D's 2), so 8192 x 8192 outputs need about 1.3 GiB with D's copies, refused under a 1 GiB limit (the
/// estimate without them, 0.13 GiB, would have run); a small run fits 1 MiB.
#[test]
fn cpu_reference_buffers_are_checked_against_host_memory() {
    let args = ["--device", "cpu", "--mode", "w4a16", "--out", "bf16", "--m", "8192", "--n", "8192", "--k", "32"];
    let o = Command::new(exe()).args(args).env("NVFP4_GEMM_HOST_MEMORY", (1u64 << 30).to_string()).output().unwrap();
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stderr_one_line(&o).contains("the host buffers need about 1.3 GiB, 1.0 GiB is available"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(exe()).args(["--device", "cpu", "--mode", "w4a16", "--m", "64", "--n", "64", "--k", "64"]).env("NVFP4_GEMM_HOST_MEMORY", (1u64 << 20).to_string()).output().unwrap();
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(exe()).args(["--device", "cpu", "--m", "64", "--n", "64", "--k", "64"]).env("NVFP4_GEMM_HOST_MEMORY", "1G").output().unwrap();
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stderr_one_line(&o).contains("NVFP4_GEMM_HOST_MEMORY = \"1G\": must be a number of bytes"), "{}", String::from_utf8_lossy(&o.stderr));
    // An --input file is read and its operands copied before any other check: refused where
    // twice its size is not available.
    let f = tmp("memory-input.safetensors");
    run_ok(&["--device", "cpu", "--m", "8", "--n", "32", "--k", "64", "--save", f.to_str().unwrap()]);
    let len = std::fs::metadata(&f).unwrap().len();
    let o = Command::new(exe()).args(["--device", "cpu", "--input", f.to_str().unwrap()]).env("NVFP4_GEMM_HOST_MEMORY", (2 * len - 1).to_string()).output().unwrap();
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stderr_one_line(&o).contains("need about twice that"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(exe()).args(["--device", "cpu", "--input", f.to_str().unwrap()]).env("NVFP4_GEMM_HOST_MEMORY", (1u64 << 20).to_string()).output().unwrap();
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    // A checkpoint layer is sized from its header and refused before its data is read (a probe
    // read a sparse 9 GiB layer whole, then refused it, and aborted under a memory limit): the
    // NaN block scale this layer holds would be the error had its data been read first.
    let ck = tmp("memory-ck.safetensors");
    modelopt_file(&ck, 32, 64, |t| t[1].3[3] = 0x7F);
    let args = ["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "2"];
    let o = Command::new(exe()).args(args).env("NVFP4_GEMM_HOST_MEMORY", "1000").output().unwrap();
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stderr_one_line(&o).contains("is available"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(exe()).args(args).env("NVFP4_GEMM_HOST_MEMORY", (1u64 << 20).to_string()).output().unwrap();
    assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stderr_one_line(&o).contains("l.weight_scale: element 3"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Probe finding: --save wrote in place, so a failed write (here the file size limit) left a
/// truncated file, destroying an existing one. Now nothing is written unless all of it is.
#[cfg(unix)]
#[test]
fn a_failed_save_writes_nothing() {
    let keep = tmp("keep.safetensors");
    std::fs::write(&keep, b"keep").unwrap();
    let new = tmp("new.safetensors");
    for f in [&keep, &new] {
        let o = Command::new("sh").args(["-c", "ulimit -f 1 && exec \"$0\" --device cpu --m 64 --n 64 --k 64 --save \"$1\"", exe().to_str().unwrap(), f.to_str().unwrap()]).output().unwrap();
        assert_eq!(code(&o), 2, "{}", String::from_utf8_lossy(&o.stderr));
        assert!(stderr_one_line(&o).contains("cannot write"), "{}", String::from_utf8_lossy(&o.stderr));
    }
    assert_eq!(std::fs::read(&keep).unwrap(), b"keep", "the existing file is kept as it was");
    assert!(!new.exists(), "no partial file");
    let left: Vec<String> = std::fs::read_dir(keep.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.contains(".partial-") && (n.contains("keep.") || n.contains("new."))).collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    // Without the limit the same call replaces the file.
    run_ok(&["--device", "cpu", "--m", "64", "--n", "64", "--k", "64", "--save", keep.to_str().unwrap()]);
    SafeTensors::deserialize(&std::fs::read(&keep).unwrap()).unwrap().tensor("d").unwrap();
}

/// Probe finding: the default norm constant of FP4 output ignored beta * C (with --beta 1000
/// every scale factor saturated) and depended on the rows --check-budget samples. Now it covers
/// the epilogue's values, is the same at any --check-budget, and the report, the JSON and the
/// saved file give it, so the output decodes.
#[test]
fn fp4_default_norm_constant_is_the_datas() {
    let (m, n, k) = (130, 64, 96);
    let base = ["--device", "cpu", "--out", "nvfp4", "--m", "130", "--n", "64", "--k", "96", "--beta", "1000", "--seed", "4", "--json"];
    let f = tmp("fp4-beta.safetensors");
    let o = run_ok(&[&base[..], &["--save", f.to_str().unwrap()]].concat());
    let bytes = std::fs::read(&f).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (got, norm) = fp4_decoded(&file, m, n);
    let json = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(json.contains(&format!("\"norm_constant\":{}", norm as f32)), "{json}");
    let want = independent(&file, m, n, k, 1, 1.0, 1000.0);
    for (i, ((g, scale), w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1.5 * scale, "element {i}: decoded {g}, exact {w} (norm constant {norm})");
    }
    // The largest scale factor at the top of ue4m3 (448), not every one there.
    let sfd = file.tensor("sfd").unwrap().data().to_vec();
    assert!(sfd.contains(&0x7E) && sfd.iter().filter(|&&b| b == 0x7E).count() < m * n / 16 / 2, "scale factors: {:?}", &sfd[..32]);
    // Any --check-budget: the same constant and bytes.
    let f2 = tmp("fp4-beta-budget.safetensors");
    run_ok(&[&base[..], &["--check-budget", "1", "--save", f2.to_str().unwrap()]].concat());
    let bytes2 = std::fs::read(&f2).unwrap();
    let file2 = SafeTensors::deserialize(&bytes2).unwrap();
    for t in ["d", "sfd", "norm_constant"] {
        assert_eq!(file2.tensor(t).unwrap().data(), file.tensor(t).unwrap().data(), "{t} depends on --check-budget");
    }
    // The report names it too.
    let o = run(&base[..base.len() - 1]);
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("norm_constant={}", norm as f32)), "{}", String::from_utf8_lossy(&o.stdout));
}

/// Probe finding: the CPU W4A16 path folded alpha into the weight's global scale unchecked, so an
/// overflow or underflow gave inf or zeros with exit 0; it is refused as the GPU path and
/// --mode nvfp4 refuse it.
#[test]
fn w4a16_alpha_fold_is_checked() {
    for (g, alpha, says) in [(1e30f32, "1e12", "is inf: must be finite"), (1e-30, "1e-20", "is 0: must be finite, and nonzero")] {
        let ck = tmp(&format!("ck-fold-{g}.safetensors"));
        modelopt_file(&ck, 32, 64, |t| t[2].3 = g.to_le_bytes().to_vec());
        for mode in ["w4a16", "nvfp4"] {
            refused(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "2", "--mode", mode, "--alpha", alpha], says);
        }
    }
}

/// Probe finding: the checkpoint loader took files the safetensors format (and --input) refuses:
/// bytes after the last tensor, here; overlaps and holes are covered by the loader's unit tests.
#[test]
fn checkpoints_must_cover_their_data_exactly() {
    let ck = tmp("ck-trailing.safetensors");
    modelopt_file(&ck, 32, 64, |_| {});
    let mut bytes = std::fs::read(&ck).unwrap();
    bytes.extend_from_slice(b"garbage!");
    std::fs::write(&ck, bytes).unwrap();
    refused(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", "3"], &format!("{}: 8 bytes of data follow the tensors", ck.display()));
}

/// Probe finding: --input ignored the global scales --save writes for checkpoint runs, so reading
/// such a file back changed D by ga * gb. They are folded into alpha now, and the FP4 output of
/// a checkpoint run on the CPU folds them too.
#[test]
fn saved_global_scales_are_applied() {
    let (n, k, m) = (64, 256, 5);
    let ck = tmp("ck-rt.safetensors");
    modelopt_file(&ck, n, k, |_| {});
    let f1 = tmp("ck-rt-1.safetensors");
    run_ok(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", &m.to_string(), "--mode", "nvfp4", "--out", "f32", "--alpha", "0.5", "--save", f1.to_str().unwrap()]);
    let f2 = tmp("ck-rt-2.safetensors");
    run_ok(&["--device", "cpu", "--input", f1.to_str().unwrap(), "--out", "f32", "--alpha", "0.5", "--save", f2.to_str().unwrap()]);
    let (b1, b2) = (std::fs::read(&f1).unwrap(), std::fs::read(&f2).unwrap());
    let (st1, st2) = (SafeTensors::deserialize(&b1).unwrap(), SafeTensors::deserialize(&b2).unwrap());
    assert_eq!(st2.tensor("d").unwrap().data(), st1.tensor("d").unwrap().data(), "the round trip reproduces d");
    // FP4 output of the same layer: decodes to alpha * ga * gb * A·Bᵀ.
    let f3 = tmp("ck-rt-fp4.safetensors");
    run_ok(&["--device", "cpu", "--checkpoint", ck.to_str().unwrap(), "--layer", "l", "--m", &m.to_string(), "--mode", "nvfp4", "--out", "nvfp4", "--save", f3.to_str().unwrap()]);
    let b3 = std::fs::read(&f3).unwrap();
    let st3 = SafeTensors::deserialize(&b3).unwrap();
    let scalar = |name: &str| f32::from_le_bytes(st3.tensor(name).unwrap().data().try_into().unwrap()) as f64;
    let want = independent(&st3, m, n, k, 1, scalar("global_scale_a") * scalar("global_scale_b"), 0.0);
    let (got, _) = fp4_decoded(&st3, m, n);
    for (i, ((g, scale), w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1.5 * scale, "element {i}: decoded {g}, exact {w}");
    }
}

/// A flag the run would not use is refused: --norm-constant scales FP4 output only.
#[test]
fn norm_constant_without_fp4_output_is_refused() {
    for out in ["f16", "bf16", "f32"] {
        refused(&["--device", "cpu", "--m", "3", "--n", "32", "--k", "64", "--out", out, "--norm-constant", "2"], "--norm-constant 2: scales FP4 output only");
    }
    refused(&["--device", "cpu", "--m", "3", "--n", "32", "--k", "64", "--mode", "w4a16", "--norm-constant", "2"], "--norm-constant 2");
}

/// A FIFO as --input or --checkpoint is refused before it is opened (opening one blocks until a
/// writer comes): the run is given 20 s, then killed and the test fails. Where `mkfifo` is
/// missing, a Unix socket file (not regular either) takes its place, so the refusal is still
/// checked.
#[cfg(unix)]
#[test]
fn inputs_that_are_not_regular_files_are_refused() {
    let fifo = tmp("fifo.safetensors");
    if !Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
        eprintln!("mkfifo is not available: a Unix socket file instead of a FIFO");
        std::os::unix::net::UnixListener::bind(&fifo).expect("a Unix socket file");
    }
    for flag in [&["--input"][..], &["--layer", "l", "--checkpoint"][..]] {
        let mut child = Command::new(exe()).args(["--device", "cpu"]).args(flag).arg(&fifo).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let t = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t.elapsed().as_secs() > 20 {
                child.kill().unwrap();
                panic!("{flag:?} FIFO: still running after 20 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        assert_eq!(code(&o), 2, "{flag:?}: {}", String::from_utf8_lossy(&o.stderr));
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("not a regular file") && e.contains(&*fifo.to_string_lossy()), "{flag:?}: {e}");
    }
}

/// Probe findings: --save renamed its file over whatever the path held (a device node such as
/// /dev/full, a FIFO, a symlink itself) and reset a read-only file's permissions; --input read a
/// procfs file that reports length 0 without end.
#[cfg(unix)]
#[test]
fn save_replaces_only_regular_files_and_input_reads_its_length() {
    use std::os::unix::fs::PermissionsExt;
    let target = tmp("save-target.safetensors");
    std::fs::write(&target, b"keep").unwrap();
    let link = tmp("save-link.safetensors");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let args = ["--device", "cpu", "--m", "1", "--n", "32", "--k", "32", "--save", link.to_str().unwrap()];
    refused(&args, "exists and is not a regular file");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    let ro = tmp("save-readonly.safetensors");
    std::fs::write(&ro, b"old").unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    run_ok(&["--device", "cpu", "--m", "1", "--n", "32", "--k", "32", "--save", ro.to_str().unwrap()]);
    assert_eq!(std::fs::metadata(&ro).unwrap().permissions().mode() & 0o777, 0o444);
    if Path::new("/proc/self/pagemap").exists() {
        refused(&["--device", "cpu", "--input", "/proc/self/pagemap"], "not a safetensors file");
    }
}
