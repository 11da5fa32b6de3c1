//! The workspace under CUDA-graph capture, on a GPU (cases first written by an adversarial
//! review of that surface): each case
//! poisons its outputs (0xA5 bytes), makes the call, asserts the typed error or the exact result,
//! that the outputs are as expected afterwards, and where a capture is open that it is still
//! valid. Its own harness (`harness = false`): a case without a suitable device is skipped.
#![allow(clippy::type_complexity)]
use blockscaled_gemm::{BlockScaledGemm, Error, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, OutType, Problem};
use cudarc::driver::sys::{CUstreamCaptureMode, CUstreamCaptureStatus, CUgraphInstantiate_flags};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use half::f16;
use std::sync::Arc;

mod harness;
use harness::Outcome;

fn main() {
    let tests: &[(&str, fn() -> Outcome)] = &[
        ("gpu_release_workspace_during_capture_is_typed", gpu_release_workspace_during_capture_is_typed),
        ("gpu_capture_with_other_output_type_than_reserved", gpu_capture_with_other_output_type_than_reserved),
        ("gpu_sm100_fp4_capture_without_norm_slot", gpu_sm100_fp4_capture_without_norm_slot),
        ("gpu_limit_below_current_workspace_keeps_it", gpu_limit_below_current_workspace_keeps_it),
        ("gpu_growth_during_global_capture_elsewhere", gpu_growth_during_global_capture_elsewhere),
        ("gpu_two_gemms_on_one_stream_captured", gpu_two_gemms_on_one_stream_captured),
        ("gpu_checkpoint_loaders_refuse_capture_before_reading", gpu_checkpoint_loaders_refuse_capture_before_reading),
    ];
    harness::run("gpu_workspace", tests);
}

/// A context with cudarc's event tracking off (as capture needs), a stream and a GEMM on it, on a
/// device that runs this build's kernels.
fn gpu() -> Result<(Arc<CudaContext>, Arc<CudaStream>, BlockScaledGemm), String> {
    harness::gpu_present()?;
    let ctx = CudaContext::new(0).expect("context");
    // SAFETY: every buffer of these cases is used on its one stream, in order.
    unsafe { ctx.disable_event_tracking() };
    let s = ctx.new_stream().expect("stream");
    let g = BlockScaledGemm::new(s.clone()).expect("gemm");
    if g.device().arch().is_none() {
        return Err(format!("device {:?} runs no kernel of this build", g.device().compute_capability));
    }
    Ok((ctx, s, g))
}

fn operands(s: &Arc<CudaStream>, m: usize, n: usize, k: usize) -> (Nvfp4Matrix, Nvfp4Matrix, Nvfp4Tensor, Nvfp4Tensor) {
    let a = Nvfp4Matrix::random_contest((1, m, k), 21).unwrap();
    let b = Nvfp4Matrix::random_contest((1, n, k), 22).unwrap();
    let (ad, bd) = (Nvfp4Tensor::upload(&a, s).unwrap(), Nvfp4Tensor::upload(&b, s).unwrap());
    (a, b, ad, bd)
}

fn poison_u8(s: &Arc<CudaStream>, n: usize) -> CudaSlice<u8> {
    s.clone_htod(&vec![0xA5u8; n]).unwrap()
}

fn poison_f16(s: &Arc<CudaStream>, n: usize) -> CudaSlice<f16> {
    s.clone_htod(&vec![f16::from_bits(0xA5A5); n]).unwrap()
}

fn assert_poisoned_u8(s: &Arc<CudaStream>, d: &CudaSlice<u8>, what: &str) {
    s.synchronize().unwrap();
    assert!(s.clone_dtoh(d).unwrap().iter().all(|&x| x == 0xA5), "{what}: a refused call wrote the buffer");
}


fn begin(s: &Arc<CudaStream>, mode: CUstreamCaptureMode) {
    s.begin_capture(mode).unwrap();
}

/// Asserts the capture on `s` is still active (not invalidated by the call), then ends it.
fn end_valid(s: &Arc<CudaStream>, what: &str) {
    let status = s.capture_status().unwrap();
    let ended = s.end_capture(CUgraphInstantiate_flags(0));
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "{what}: the call invalidated the capture");
    assert!(ended.is_ok(), "{what}: end_capture failed: {:?}", ended.err());
}

/// `release_workspace` during capture on the GEMM's stream. Today it synchronizes the stream,
/// which a capturing stream refuses (and the driver invalidates the capture). Expect a typed
/// refusal (`NotCapturable` or `WorkspaceDuringCapture`) before touching the stream, the
/// workspace kept, and the capture still valid.
fn gpu_release_workspace_during_capture_is_typed() -> Outcome {
    let (_ctx, s, g) = gpu()?;
    g.reserve_workspace(1 << 20).unwrap();
    begin(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let r = unsafe { g.release_workspace() };
    let status = s.capture_status().unwrap();
    let _ = s.end_capture(CUgraphInstantiate_flags(0));
    assert!(matches!(r, Err(Error::NotCapturable { .. }) | Err(Error::WorkspaceDuringCapture { .. })), "release_workspace during capture: {r:?}");
    assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "release_workspace invalidated the capture");
    assert_eq!(g.workspace_bytes(), 1 << 20);
    Ok(())
}

/// Reserve for an f16 call, then capture the same shape with FP4 output, whose launch (split
/// through global memory on Hopper at 64 x 4096 x 7168) needs more. Expect
/// `WorkspaceDuringCapture { need: workspace_size(Nvfp4), have: the reserved bytes }`, D and SFD
/// untouched, the workspace not grown, the capture valid; then eager, the call succeeds.
fn gpu_capture_with_other_output_type_than_reserved() -> Outcome {
    let (_ctx, s, g) = gpu()?;
    let p = Problem::new(64, 4096, 7168);
    let (f16_need, fp4_need) = (g.workspace_size(&p, OutType::F16, None).unwrap(), g.workspace_size(&p, OutType::Nvfp4, None).unwrap());
    if fp4_need <= f16_need {
        return Err(format!("here nvfp4 needs {fp4_need} bytes, f16 {f16_need}: nothing to probe"));
    }
    g.reserve_workspace(f16_need).unwrap();
    let have = g.workspace_bytes();
    let (_, _, a, b) = operands(&s, p.m, p.n, p.k);
    let (mut dv, mut ds) = (poison_u8(&s, p.cd_elems() / 2), poison_u8(&s, p.sfd_bytes()));
    s.synchronize().unwrap();
    begin(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let e = g.gemm_fp4(&p, OutType::Nvfp4, &a, &b, Nvfp4Output::new(&mut dv, &mut ds), None).unwrap_err();
    end_valid(&s, "gemm_fp4 refused during capture");
    assert!(matches!(e, Error::WorkspaceDuringCapture { need, have: h } if need == fp4_need && h == have), "{e}");
    assert_poisoned_u8(&s, &dv, "D");
    assert_poisoned_u8(&s, &ds, "SFD");
    assert_eq!(g.workspace_bytes(), have);
    g.gemm_fp4(&p, OutType::Nvfp4, &a, &b, Nvfp4Output::new(&mut dv, &mut ds), None).unwrap();
    assert!(g.workspace_bytes() >= fp4_need);
    Ok(())
}

/// SM100: an eager f16 call grows the workspace but not the FP4 norm-constant slot; a gemm_fp4
/// during capture then needs the slot. Expect `WorkspaceDuringCapture` (its `have` today is 0,
/// not the reserved bytes: noted in the report), D and SFD untouched, the capture valid.
fn gpu_sm100_fp4_capture_without_norm_slot() -> Outcome {
    let (_ctx, s, g) = gpu()?;
    if g.device().arch() != Some(100) {
        return Err("needs compute capability 10.0".into());
    }
    let p = Problem::new(128, 256, 512);
    let (_, _, a, b) = operands(&s, p.m, p.n, p.k);
    let mut d16 = s.alloc_zeros::<f16>(p.cd_elems()).unwrap();
    g.gemm(&p, &a, &b, &mut d16, None).unwrap();
    let (mut dv, mut ds) = (poison_u8(&s, p.cd_elems() / 2), poison_u8(&s, p.sfd_bytes()));
    s.synchronize().unwrap();
    begin(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    let e = g.gemm_fp4(&p, OutType::Nvfp4, &a, &b, Nvfp4Output::new(&mut dv, &mut ds), None).unwrap_err();
    end_valid(&s, "gemm_fp4 without the norm slot");
    assert!(matches!(e, Error::WorkspaceDuringCapture { .. }), "{e}");
    assert_poisoned_u8(&s, &dv, "D");
    assert_poisoned_u8(&s, &ds, "SFD");
    Ok(())
}

/// A limit set below the current workspace does not shrink it: calls that fit keep running, a
/// reserve within the current size is Ok, a reserve beyond it above the limit is
/// `WorkspaceLimit` and leaves the workspace as it was.
fn gpu_limit_below_current_workspace_keeps_it() -> Outcome {
    let (_ctx, s, g) = gpu()?;
    g.reserve_workspace(8 << 20).unwrap();
    g.set_workspace_limit(Some(1 << 20));
    g.reserve_workspace(4 << 20).unwrap();
    assert_eq!(g.workspace_bytes(), 8 << 20);
    let e = g.reserve_workspace(9 << 20).unwrap_err();
    assert!(matches!(e, Error::WorkspaceLimit { need, limit } if need == 9 << 20 && limit == 1 << 20), "{e}");
    assert_eq!(g.workspace_bytes(), 8 << 20);
    let p = Problem::new(16, 4096, 7168);
    let (a, b, ad, bd) = operands(&s, p.m, p.n, p.k);
    if g.workspace_size(&p, OutType::F16, None).unwrap() <= 8 << 20 {
        let mut d = poison_f16(&s, p.cd_elems());
        g.gemm(&p, &ad, &bd, &mut d, None).unwrap();
        let want: Vec<f16> = blockscaled_gemm::reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
        s.synchronize().unwrap();
        assert!(blockscaled_gemm::compare::compare(&s.clone_dtoh(&d).unwrap(), &want, 0.0, 0.0).unwrap().passed());
    }
    Ok(())
}

/// Another stream captures in global mode on this thread while an eager call on the GEMM's
/// (not capturing) stream grows the workspace (cuMemAlloc, a call the global mode prohibits).
/// Expect: the eager call either succeeds or returns a typed error with D untouched, and the
/// other stream's capture is still valid afterwards.
fn gpu_growth_during_global_capture_elsewhere() -> Outcome {
    let (ctx, s, g) = gpu()?;
    let other = ctx.new_stream().unwrap();
    let p = Problem::new(256, 4096, 7168);
    if g.workspace_size(&p, OutType::F16, None).unwrap() == 0 {
        return Err("256 x 4096 x 7168 needs no workspace here".into());
    }
    let (_, _, a, b) = operands(&s, p.m, p.n, p.k);
    let mut d = poison_f16(&s, p.cd_elems());
    s.synchronize().unwrap();
    begin(&other, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
    let r = g.gemm(&p, &a, &b, &mut d, None);
    end_valid(&other, "an eager call on another stream during a global-mode capture");
    // The workspace grows in relaxed capture mode, so the call runs.
    r.expect("an eager call that grows the workspace while another stream captures in global mode");
    s.synchronize().unwrap();
    assert!(s.clone_dtoh(&d).unwrap().iter().any(|x| x.to_bits() != 0xA5A5), "D was not written");
    Ok(())
}

/// Two GEMM objects on one stream, both captured in one graph: each has its own workspace;
/// replaying after one of them grew (eager, larger shape) gives the reference result.
fn gpu_two_gemms_on_one_stream_captured() -> Outcome {
    let (_ctx, s, g1) = gpu()?;
    let g2 = BlockScaledGemm::new(s.clone()).unwrap();
    let p = Problem::new(64, 4096, 7168);
    let (a, b, ad, bd) = operands(&s, p.m, p.n, p.k);
    for g in [&g1, &g2] {
        g.reserve_workspace(g.workspace_size(&p, OutType::F16, None).unwrap()).unwrap();
    }
    let (mut d1, mut d2) = (poison_f16(&s, p.cd_elems()), poison_f16(&s, p.cd_elems()));
    s.synchronize().unwrap();
    begin(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    g1.gemm(&p, &ad, &bd, &mut d1, None).unwrap();
    g2.gemm(&p, &ad, &bd, &mut d2, None).unwrap();
    let graph = s.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    // Grow g1's workspace with an eager call of a larger need; the graph keeps the old buffer.
    let q = Problem::new(256, 4096, 7168);
    let (_, _, qa, qb) = operands(&s, q.m, q.n, q.k);
    let mut dq = s.alloc_zeros::<f16>(q.cd_elems()).unwrap();
    g1.gemm(&q, &qa, &qb, &mut dq, None).unwrap();
    graph.launch().unwrap();
    s.synchronize().unwrap();
    let want: Vec<f16> = blockscaled_gemm::reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
    for (d, what) in [(&d1, "g1"), (&d2, "g2")] {
        let got = s.clone_dtoh(d).unwrap();
        assert!(blockscaled_gemm::compare::compare(&got, &want, 0.0, 0.0).unwrap().passed(), "{what}: replay after growth");
    }
    Ok(())
}

/// Every device loader of a checkpoint during capture: `NotCapturable` naming the call, the
/// capture still valid, and nothing read (the file is removed after its header was: a loader
/// that read would give an I/O error instead). Eager after the capture, with the file back, each
/// loads.
fn gpu_checkpoint_loaders_refuse_capture_before_reading() -> Outcome {
    use blockscaled_gemm::checkpoint::Checkpoint;
    use safetensors::{tensor::TensorView, Dtype};
    let (_ctx, s, _g) = gpu()?;
    let (n, k) = (64, 128);
    let w = Nvfp4Matrix::random_contest((1, n, k), 23).unwrap();
    let rm = blockscaled_gemm::layout::from_tiled(w.scales(), (1, n, k / 16)).unwrap();
    let g2 = 0.5f32.to_le_bytes();
    let mut t: Vec<(String, Dtype, Vec<usize>, &[u8])> = Vec::new();
    for p in ["x.0", "x.1"] {
        t.push((format!("{p}.weight"), Dtype::U8, vec![n, k / 2], w.data()));
        t.push((format!("{p}.weight_scale"), Dtype::F8_E4M3, vec![n, k / 16], &rm[..]));
        t.push((format!("{p}.weight_scale_2"), Dtype::F32, vec![], &g2[..]));
    }
    let views: Vec<(String, TensorView<'_>)> = t.iter().map(|(name, d, shape, b)| (name.clone(), TensorView::new(*d, shape.clone(), b).unwrap())).collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    let path = std::env::temp_dir().join(format!("bsg-gpu-ws-ck-{}.safetensors", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let calls: [(&str, &dyn Fn() -> blockscaled_gemm::Result<()>); 5] = [
        ("Checkpoint::layer_to_device", &|| ck.layer_to_device("x.0", &s).map(drop)),
        ("Checkpoint::layer_shard_to_device", &|| ck.layer_shard_to_device("x.0", 0..32, 0..k, &s).map(drop)),
        ("Checkpoint::fused_to_device", &|| ck.fused_to_device(&["x.0", "x.1"], &s).map(drop)),
        ("Checkpoint::experts_to_device", &|| ck.experts_to_device(2, |e| format!("x.{e}"), &s).map(drop)),
        ("Checkpoint::experts_shard_to_device", &|| ck.experts_shard_to_device(2, |e| format!("x.{e}"), 0..n, 32..k, &s).map(drop)),
    ];
    for (name, call) in &calls {
        begin(&s, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
        let r = call();
        end_valid(&s, name);
        assert!(matches!(&r, Err(Error::NotCapturable { call, .. }) if call == name), "{name} during capture: {r:?}");
    }
    std::fs::write(&path, &bytes).unwrap();
    for (name, call) in &calls {
        call().unwrap_or_else(|e| panic!("{name} eager: {e}"));
    }
    std::fs::remove_file(&path).ok();
    Ok(())
}
