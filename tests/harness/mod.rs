//! The runner of the GPU test executables (`harness = false`): a case that lacks its device is
//! counted as skipped, with its reason, never as passed.

/// A case's outcome when it does not panic: ran, or skipped for a reason.
pub type Outcome = Result<(), String>;

/// Runs the cases whose names contain one of the command line's arguments (all without any),
/// prints each outcome and `suite: P passed, F failed, S skipped`, and exits 1 if one failed.
pub fn run(suite: &str, tests: &[(&str, fn() -> Outcome)]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|x| name.contains(x.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(f) {
            Ok(Ok(())) => { passed += 1; println!("test {name} ... ok"); }
            Ok(Err(why)) => { skipped += 1; println!("test {name} ... SKIPPED: {why}"); }
            Err(_) => { failed += 1; println!("test {name} ... FAILED"); }
        }
    }
    println!("{suite}: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// Ok where an NVIDIA driver and a CUDA device are present, else the reason to skip.
pub fn gpu_present() -> Outcome {
    if !blockscaled_gemm::BlockScaledGemm::driver_present() {
        return Err("no NVIDIA driver (libcuda not found)".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(()),
        other => Err(format!("no CUDA device ({other:?})")),
    }
}
