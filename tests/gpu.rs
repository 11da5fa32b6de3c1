//! GPU integration tests, with their own harness (`harness = false`) so that a test without a
//! suitable device is counted as skipped, with its reason, never as passed.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use blockscaled_gemm::compare::compare;
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, Error, Nvfp4Matrix, Nvfp4Operand, OutType, OutputElement, Problem};
use cudarc::driver::CudaContext;
use half::{bf16, f16};
use std::sync::Arc;

/// A test's outcome when it does not panic: ran, or skipped for a reason.
type Outcome = Result<(), String>;

/// The device's GEMM, or the reason there is none.
fn device() -> Result<BlockScaledGemm, String> {
    if !BlockScaledGemm::driver_present() {
        return Err("no NVIDIA driver (libcuda not found)".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        other => return Err(format!("no CUDA device ({other:?})")),
    }
    let stream = CudaContext::new(0).expect("context on device 0").default_stream();
    Ok(BlockScaledGemm::new(stream).expect("BlockScaledGemm on device 0"))
}

fn main() {
    let tests: &[(&str, fn() -> Outcome)] = &[
        ("sm100_every_config_against_the_reference", sm100_every_config_against_the_reference),
        ("wrong_architecture_is_refused_and_nothing_is_written", wrong_architecture_is_refused_and_nothing_is_written),
        ("device_buffer_errors_are_typed", device_buffer_errors_are_typed),
    ];
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
    println!("gpu: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}

fn upload(g: &BlockScaledGemm, m: &Nvfp4Matrix) -> (cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>) {
    let s = g.stream();
    (s.clone_htod(m.data()).unwrap(), s.clone_htod(m.scales()).unwrap())
}

/// Runs one problem on the device with a NaN-poisoned D and checks every element against the
/// reference. Contest data sums exactly in FP32, so tolerances are the contest's 1e-3.
fn check<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, m: usize, n: usize, k: usize, l: usize, alpha: f32, beta: f32, config: Option<Config>, seed: u64) {
    let a = Nvfp4Matrix::random_contest(m, k, l, seed).unwrap();
    let b = Nvfp4Matrix::random_contest(n, k, l, seed + 1).unwrap();
    let c: Vec<T> = (0..l * m * n).map(|i| T::from_f64(((i * 7919) % 17) as f64 - 8.0)).collect();
    let s = g.stream();
    let (av, asf) = upload(g, &a);
    let (bv, bsf) = upload(g, &b);
    let mut d = s.clone_htod(&vec![T::from_f64(f64::NAN); l * m * n]).unwrap();
    let p = Problem::new(m, n, k).batch(l).scalars(alpha, beta);
    let ran = if beta != 0.0 {
        let cd = s.clone_htod(&c).unwrap();
        g.gemm_with_c(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &cd, &mut d, config).unwrap()
    } else {
        g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, config).unwrap()
    };
    let got = s.clone_dtoh(&d).unwrap();
    let want: Vec<T> = reference_gemm(&a, &b, alpha, beta, (beta != 0.0).then_some(&c[..])).unwrap();
    let cmp = compare(&got, &want, 1e-3, 1e-3);
    assert!(cmp.passed(), "{ran} {m}x{n}x{k}x{l}: {cmp}");
}

fn sm100_every_config_against_the_reference() -> Outcome {
    let g = device()?;
    if g.device().compute_capability != (10, 0) {
        return Err(format!("device is {:?}, the SM100 kernels need compute capability 10.0", g.device().compute_capability));
    }
    for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 100) {
        check::<f16>(&g, 256, 512, 512, 1, 1.0, 0.0, Some(c), 1);
        check::<bf16>(&g, 130, 264, 256, 2, 0.5, 1.5, Some(c), 2);
    }
    for (i, &(m, n, k)) in [(128, 256, 256), (128, 1536, 7168), (128, 3072, 1536), (256, 7168, 256), (256, 7168, 2048), (2304, 4608, 7168), (384, 7168, 2304), (512, 512, 7168), (512, 4096, 512), (512, 1536, 7168)].iter().enumerate() {
        check::<f16>(&g, m, n, k, 1, 1.0, 0.0, None, 10 + i as u64);
    }
    Ok(())
}

fn wrong_architecture_is_refused_and_nothing_is_written() -> Outcome {
    let g = device()?;
    let cc = g.device().compute_capability;
    let (m, n, k) = (128, 128, 256);
    let a = Nvfp4Matrix::random_contest(m, k, 1, 3).unwrap();
    let (av, asf) = upload(&g, &a);
    let s = g.stream().clone();
    let poison = vec![f16::from_f32(-7.0); m * n];
    let mut d = s.clone_htod(&poison).unwrap();
    let p = Problem::new(m, n, k);
    for c in Config::ALL.iter().copied().filter(|c| c.compute_capability() != cc) {
        let e = g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&av, &asf), &mut d, Some(c)).unwrap_err();
        assert!(matches!(e, Error::ArchMismatch { .. }), "{c}: {e}");
        println!("{c} on {cc:?}: {e}");
    }
    if g.device().arch().is_none() {
        let e = g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&av, &asf), &mut d, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { .. }), "{e}");
        println!("automatic choice on {cc:?}: {e}");
    }
    s.synchronize().unwrap();
    assert_eq!(s.clone_dtoh(&d).unwrap(), poison, "a refused launch must not write D");
    Ok(())
}

fn device_buffer_errors_are_typed() -> Outcome {
    let g = device()?;
    let s: Arc<_> = g.stream().clone();
    let p = Problem::new(128, 128, 256);
    let a = s.alloc_zeros::<u8>(p.a_bytes()).unwrap();
    let sf = s.alloc_zeros::<u8>(p.sfa_bytes()).unwrap();
    let short = s.alloc_zeros::<u8>(p.sfa_bytes() - 1).unwrap();
    let mut d = s.alloc_zeros::<f32>(p.cd_elems()).unwrap();
    let e = g.gemm(&p, Nvfp4Operand::new(&a, &short), Nvfp4Operand::new(&a, &sf), &mut d, None).unwrap_err();
    assert!(e.to_string().starts_with("SFA: holds"), "{e}");
    // A view one byte in: misaligned, and refused before any launch (when the arch runs at all).
    let big = s.alloc_zeros::<u8>(p.a_bytes() + 1).unwrap();
    let view = big.slice(1..);
    match g.gemm(&p, Nvfp4Operand::new(&view, &sf), Nvfp4Operand::new(&a, &sf), &mut d, None) {
        Err(Error::Misaligned { name: "A", .. }) | Err(Error::UnsupportedDevice { .. }) => {}
        other => panic!("expected a misalignment refusal, got {other:?}"),
    }
    assert_eq!(g.select_config(&p, OutType::F32).is_ok(), g.device().arch().is_some() && Config::ALL.iter().any(|c| c.is_built(OutType::F32) && c.compute_capability() == g.device().compute_capability));
    Ok(())
}
