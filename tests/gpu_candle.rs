//! `candle::Nvfp4Linear` on a GPU (feature `candle`), in both modes: every forward is judged
//! against the exact CPU reference (in `Nvfp4` mode on the same activations quantized on the host
//! with the same input scale, in `W4a16` mode on the activations as they are), and every bad input
//! must come back as an error from `forward`, never a crash or a result. Its own harness
//! (`harness = false`): without a device that runs this build's kernels each case is skipped.
//!
//! Needs candle linked (cuBLAS, cuRAND, libcuda at load time): see bench/README.md, "Commands".
#![allow(clippy::type_complexity)]
use blockscaled_gemm::candle::{LinearMode, Nvfp4Experts, Nvfp4Linear};
use blockscaled_gemm::compare::{verify_matrices, Verdict};
use blockscaled_gemm::{Activation16, BlockScaledGemm, HostFloat, Nvfp4Matrix, Nvfp4Tensor};
use candle_core::{DType, Device, Tensor, WithDType};

mod harness;
use harness::Outcome;

fn main() {
    let tests: &[(&str, fn() -> Outcome)] = &[
        ("candle_forward_rows_and_dtypes", candle_forward_rows_and_dtypes),
        ("candle_forward_model_shape", candle_forward_model_shape),
        ("candle_forward_prepacked_weight", candle_forward_prepacked_weight),
        ("candle_forward_offset_view", candle_forward_offset_view),
        ("candle_forward_own_stream_device", candle_forward_own_stream_device),
        ("candle_forward_threads", candle_forward_threads),
        ("candle_forward_threads_own_stream", candle_forward_threads_own_stream),
        ("candle_forward_rows_shrink_and_grow", candle_forward_rows_shrink_and_grow),
        ("candle_forward_empty_batch", candle_forward_empty_batch),
        ("candle_forward_non_finite_input", candle_forward_non_finite_input),
        ("candle_forward_refusals", candle_forward_refusals),
        ("candle_forward_during_capture", candle_forward_during_capture),
        ("candle_forward_odd_shapes_and_saturation", candle_forward_odd_shapes_and_saturation),
        ("candle_forward_from_checkpoint", candle_forward_from_checkpoint),
        ("candle_new_refusals", candle_new_refusals),
        ("candle_experts_forward", candle_experts_forward),
        ("candle_experts_uncovered_rows", candle_experts_uncovered_rows),
        ("candle_experts_refusals", candle_experts_refusals),
        ("candle_experts_threads", candle_experts_threads),
        ("candle_experts_during_capture", candle_experts_during_capture),
    ];
    harness::run("gpu_candle", tests);
}

/// ModelOpt's input scale for activations within about 6 sigma (amax / (6 * 448)).
const INPUT_SCALE: f32 = 6.0 / (6.0 * 448.0);

/// The two ways a layer takes its input; most cases run both.
const MODES: [LinearMode; 2] = [LinearMode::Nvfp4 { input_scale: INPUT_SCALE }, LinearMode::W4a16];

/// A candle device (per-thread default stream, as `Device::new_cuda`) on a GPU that runs this
/// build's kernels.
fn device(own_stream: bool) -> Result<Device, String> {
    harness::gpu_present()?;
    // With a GPU present, a candle device that does not start (its cuBLAS or cuRAND not found)
    // fails the case: it is not a reason to skip.
    let d = if own_stream { Device::new_cuda_with_stream(0) } else { Device::new_cuda(0) }.unwrap_or_else(|e| panic!("candle device: {e}"));
    let s = d.as_cuda_device().expect("cuda").cuda_stream();
    let g = BlockScaledGemm::new(s).expect("gemm");
    if g.device().arch().is_none() {
        return Err(format!("device {:?} runs no kernel of this build", g.device().compute_capability));
    }
    Ok(d)
}

/// `layer.forward(x)` judged against the reference of the layer's mode: the shape `[..x, N]`,
/// every element within the FP32 bound of its exact value, and (so that a few wrong blocks cannot
/// hide under that bound at large K) at least 98 % of them exact and none needing more than a
/// quarter of it.
fn check<T: Activation16 + WithDType + HostFloat>(layer: &Nvfp4Linear, weight: &Nvfp4Matrix, x: &Tensor, what: &str) {
    let what = &format!("{:?}: {what}", layer.mode());
    let y = layer.forward(x).unwrap_or_else(|e| panic!("{what}: forward: {e}"));
    let mut want = x.dims().to_vec();
    *want.last_mut().unwrap() = weight.rows();
    assert_eq!(y.dims(), &want[..], "{what}: output shape");
    assert_eq!(y.dtype(), x.dtype(), "{what}: output dtype");
    let xs: Vec<T> = x.flatten_all().unwrap().to_vec1().unwrap();
    let got: Vec<T> = y.flatten_all().unwrap().to_vec1().unwrap();
    judge(&layer.mode().verify(&xs, weight, 1.0, &got).unwrap(), what);
}

/// The judgement of [`check`]: passed, at least 98 % exact, none beyond a quarter of its bound.
fn judge(v: &Verdict, what: &str) {
    assert!(v.passed(), "{what}: {v}");
    assert!(v.exact * 50 >= v.count * 49, "{what}: only {} of {} exact: {v}", v.exact, v.count);
    let ratio = v.worst.as_ref().map_or(0.0, |w| w.ratio);
    assert!(ratio <= 0.25, "{what}: an element needs {ratio:.3} of its FP32 bound: {v}");
}

/// `r` is an error whose words contain `says`.
fn refused<T>(r: blockscaled_gemm::Result<T>, what: &str, says: &str) {
    match r {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => assert!(e.to_string().contains(says), "{what}: the error does not say {says:?}: {e}"),
    }
}

/// Two bf16 tensors equal bit for bit.
fn assert_same_bits(a: &Tensor, b: &Tensor, what: &str) {
    let (a, b): (Vec<half::bf16>, Vec<half::bf16>) = (a.flatten_all().unwrap().to_vec1().unwrap(), b.flatten_all().unwrap().to_vec1().unwrap());
    assert!(a.len() == b.len() && a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{what}: not the same bits");
}

/// A random (N, K) weight and a layer over it on `d` taking its input as `mode` says.
fn make_layer(d: &Device, n: usize, k: usize, seed: u64, mode: LinearMode) -> (Nvfp4Matrix, Nvfp4Linear) {
    let w = Nvfp4Matrix::random_realistic((1, n, k), seed).unwrap();
    let cd = d.as_cuda_device().unwrap();
    let layer = Nvfp4Linear::with_mode(Nvfp4Tensor::upload(&w, &cd.cuda_stream()).unwrap(), mode, cd).unwrap();
    (w, layer)
}

/// Four threads at once, each `rounds` bf16 forwards of `rows(thread, round)` rows, each judged by
/// [`check`].
fn threads(d: &Device, layer: &Nvfp4Linear, w: &Nvfp4Matrix, rounds: usize, rows: fn(usize, usize) -> usize) {
    let k = w.k();
    std::thread::scope(|scope| {
        let hs: Vec<_> = (0..4usize)
            .map(|t| {
                scope.spawn(move || {
                    for round in 0..rounds {
                        let m = rows(t, round);
                        check::<half::bf16>(layer, w, &randn(d, &[m, k], DType::BF16), &format!("thread {t} round {round} [{m}, {k}]"));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("a thread's forward failed");
        }
    });
}

fn randn(d: &Device, dims: &[usize], dtype: DType) -> Tensor {
    Tensor::randn(0f32, 1.0, dims, d).unwrap().to_dtype(dtype).unwrap()
}

/// Rows 1 to 200 (the stream tiles, the swapped tiles with their pre-pass), 2-D and 3-D inputs,
/// bf16 and f16, one layer for all.
fn candle_forward_rows_and_dtypes() -> Outcome {
    let d = device(false)?;
    let (n, k) = (384, 1024);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 31, mode);
        for m in [1, 3, 16, 33, 64, 128, 200] {
            check::<half::bf16>(&layer, &w, &randn(&d, &[m, k], DType::BF16), &format!("bf16 [{m}, {k}]"));
            check::<half::f16>(&layer, &w, &randn(&d, &[m, k], DType::F16), &format!("f16 [{m}, {k}]"));
        }
        check::<half::bf16>(&layer, &w, &randn(&d, &[2, 3, 5, k], DType::BF16), "bf16 [2, 3, 5, K]");
        check::<half::f16>(&layer, &w, &randn(&d, &[4, 25, k], DType::F16), "f16 [4, 25, K]");
    }
    Ok(())
}

/// A DeepSeek-V3 sized projection at decode and prefill row counts.
fn candle_forward_model_shape() -> Outcome {
    let d = device(false)?;
    let (n, k) = (4096, 7168);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 32, mode);
        for m in [1, 16, 256] {
            check::<half::bf16>(&layer, &w, &randn(&d, &[m, k], DType::BF16), &format!("bf16 [{m}, {k}]"));
        }
    }
    Ok(())
}

/// A layer over a prepacked weight gives the standard weight's result.
fn candle_forward_prepacked_weight() -> Outcome {
    let d = device(false)?;
    let (n, k) = (512, 2048);
    let w = Nvfp4Matrix::random_realistic((1, n, k), 33).unwrap();
    let cd = d.as_cuda_device().unwrap();
    let stream = cd.cuda_stream();
    for mode in MODES {
        let standard = Nvfp4Tensor::upload(&w, &stream).unwrap();
        let packed: Nvfp4Tensor = standard.prepack(&stream).unwrap();
        let layer = Nvfp4Linear::with_mode(packed, mode, cd).unwrap();
        for m in [1, 16, 48, 130] {
            check::<half::bf16>(&layer, &w, &randn(&d, &[m, k], DType::BF16), &format!("prepacked bf16 [{m}, {k}]"));
        }
    }
    Ok(())
}

/// A contiguous view that starts inside its buffer (rows 3.. of a larger tensor) is read from its
/// offset, and the rows around it are not part of the result.
fn candle_forward_offset_view() -> Outcome {
    let d = device(false)?;
    let (n, k) = (256, 512);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 34, mode);
        let big = randn(&d, &[40, k], DType::F16);
        for (start, m) in [(3, 1), (3, 20), (1, 39)] {
            let x = big.narrow(0, start, m).unwrap();
            assert!(x.is_contiguous());
            check::<half::f16>(&layer, &w, &x, &format!("rows {start}..{} of [40, {k}]", start + m));
        }
    }
    Ok(())
}

/// `Device::new_cuda_with_stream`: one GEMM shared by every thread.
fn candle_forward_own_stream_device() -> Outcome {
    let d = device(true)?;
    let (n, k) = (256, 1024);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 35, mode);
        for m in [2, 40] {
            check::<half::bf16>(&layer, &w, &randn(&d, &[m, k], DType::BF16), &format!("own stream [{m}, {k}]"));
        }
    }
    Ok(())
}

/// One layer used by four threads at once on a per-thread-stream device (a GEMM per thread), each
/// forward exact.
fn candle_forward_threads() -> Outcome {
    let d = device(false)?;
    let (n, k) = (512, 1024);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 36, mode);
        threads(&d, &layer, &w, 3, |t, round| 1 + 37 * t + round);
    }
    Ok(())
}

/// Four threads at once on a device with a stream of its own: one lane (GEMM and activation
/// buffers) for all, each forward exact.
fn candle_forward_threads_own_stream() -> Outcome {
    let d = device(true)?;
    let (n, k) = (512, 1024);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 42, mode);
        threads(&d, &layer, &w, 4, |t, round| [200, 1, 77, 16][(t + round) % 4]);
    }
    Ok(())
}

/// The kept activation buffers: row counts that fall after a large one (a prefix of the buffers)
/// and rise past it again (new buffers), the dtypes alternating.
fn candle_forward_rows_shrink_and_grow() -> Outcome {
    let d = device(false)?;
    let (n, k) = (256, 768);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 43, mode);
        for (i, m) in [300, 1, 129, 128, 1000, 5, 257, 2100, 64].into_iter().enumerate() {
            if i % 2 == 0 {
                check::<half::bf16>(&layer, &w, &randn(&d, &[m, k], DType::BF16), &format!("step {i} bf16 [{m}, {k}]"));
            } else {
                check::<half::f16>(&layer, &w, &randn(&d, &[m, k], DType::F16), &format!("step {i} f16 [{m}, {k}]"));
            }
        }
    }
    Ok(())
}

/// No rows in, no rows out, of the right shape and dtype.
fn candle_forward_empty_batch() -> Outcome {
    let d = device(false)?;
    let (n, k) = (256, 512);
    for mode in MODES {
        let (_, layer) = make_layer(&d, n, k, 37, mode);
        for dims in [vec![0, k], vec![2, 0, k]] {
            let x = Tensor::zeros(&dims[..], DType::BF16, &d).unwrap();
            let y = layer.forward(&x).unwrap();
            let mut want = dims.clone();
            *want.last_mut().unwrap() = n;
            assert_eq!(y.dims(), &want[..]);
            assert_eq!(y.dtype(), DType::BF16);
        }
    }
    Ok(())
}

/// NaN and ±Inf in the input follow the GPU quantizer's documented rules (the device does not
/// check its inputs), which `Nvfp4Matrix::quantize_unchecked` reproduces on the host.
fn candle_forward_non_finite_input() -> Outcome {
    let d = device(false)?;
    let (n, k, m) = (256, 512, 6);
    let (w, layer) = make_layer(&d, n, k, 41, MODES[0]);
    let mut xs: Vec<half::bf16> = randn(&d, &[m, k], DType::BF16).flatten_all().unwrap().to_vec1().unwrap();
    for (i, v) in [(3, f32::NAN), (k + 17, f32::INFINITY), (2 * k + 40, f32::NEG_INFINITY), (5 * k + 511, f32::NAN)] {
        xs[i] = half::bf16::from_f32(v);
    }
    let x = Tensor::from_vec(xs.clone(), (m, k), &d).unwrap();
    let y = layer.forward(&x).unwrap();
    let xq = Nvfp4Matrix::quantize_unchecked(&xs, (1, m, k), Some(INPUT_SCALE)).unwrap();
    let got: Vec<half::bf16> = y.flatten_all().unwrap().to_vec1().unwrap();
    let v = verify_matrices(&xq, &w, 1.0, 0.0, None, &got).unwrap();
    assert!(v.passed(), "non-finite input: {v}");
    Ok(())
}

/// Inputs the layer cannot take: each an error from `forward` that says why, nothing else.
fn candle_forward_refusals() -> Outcome {
    let d = device(false)?;
    let (n, k) = (256, 512);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 38, mode);
        let other = Device::new_cuda(0).unwrap();
        let flat = randn(&d, &[8 * k + 1], DType::BF16);
        let cases: Vec<(&str, Tensor, &str)> = vec![
            ("f32 input", randn(&d, &[4, k], DType::F32), "dtype"),
            ("wrong K", randn(&d, &[4, k + 16], DType::BF16), "last dimension"),
            ("a scalar", Tensor::new(half::bf16::ONE, &d).unwrap(), "scalar"),
            ("no rows of the wrong K", Tensor::zeros((0, k + 16), DType::BF16, &d).unwrap(), "last dimension"),
            ("u8 input", Tensor::zeros((4, k), DType::U8, &d).unwrap(), "dtype"),
            ("transposed (not contiguous)", randn(&d, &[k, 4], DType::BF16).t().unwrap(), "contiguous"),
            ("on the CPU", Tensor::zeros((4, k), DType::BF16, &Device::Cpu).unwrap(), "CUDA devices only"),
            ("another candle device", randn(&other, &[4, k], DType::BF16), "another candle CudaDevice"),
            // One bf16 element into its buffer: 2-byte aligned, not 16.
            ("misaligned view", flat.narrow(0, 1, 8 * k).unwrap().reshape((8, k)).unwrap(), "is not 16-byte aligned"),
        ];
        for (what, x, says) in cases {
            match layer.forward(&x) {
                Ok(y) => panic!("{what}: accepted (output {:?})", y.dims()),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.to_lowercase().contains(&says.to_lowercase()), "{what}: the error does not say {says:?}: {msg}");
                    println!("  {what}: {}", msg.lines().next().unwrap_or(""));
                }
            }
        }
        // The layer still works after every refusal.
        check::<half::bf16>(&layer, &w, &randn(&d, &[5, k], DType::BF16), "after the refusals");
    }
    Ok(())
}

/// `Nvfp4Linear::new` refuses what would make every forward fail, with an error that names it.
fn candle_new_refusals() -> Outcome {
    let d = device(false)?;
    let cd = d.as_cuda_device().unwrap();
    let w = Nvfp4Matrix::random_realistic((1, 128, 256), 39).unwrap();
    for s in [f32::NAN, 0.0, -1.0, f32::INFINITY] {
        refused(Nvfp4Linear::from_matrix(&w, s, cd), &format!("input scale {s}"), "global scale");
    }
    let w2 = Nvfp4Matrix::random_realistic((2, 128, 256), 40).unwrap();
    refused(Nvfp4Linear::from_matrix(&w2, INPUT_SCALE, cd), "a batch-2 weight", "weight");
    refused(Nvfp4Linear::w4a16(Nvfp4Tensor::upload(&w2, &cd.cuda_stream()).unwrap(), cd), "a batch-2 weight, W4A16", "weight");
    // The weight's global scale times the input scale (the GEMM's alpha) out of f32's range.
    let stream = cd.cuda_stream();
    for (gw, gx) in [(1e30f32, 1e10f32), (1e-30, 1e-20)] {
        let (v, sc) = Nvfp4Tensor::upload(&w, &stream).unwrap().into_parts();
        let t = Nvfp4Tensor::new::<u8, u8>(v, sc, (1, 128, 256), gw).unwrap();
        refused(Nvfp4Linear::new(t, gx, cd), &format!("global scales {gw} and {gx}"), "alpha");
    }
    Ok(())
}

/// A forward while the layer's stream captures a graph is refused with a typed error (with
/// cudarc's event tracking on, as candle leaves it, `CaptureEventTracking`; with it off, the
/// layer's own `NotCapturable`), and the capture is left as it was.
fn candle_forward_during_capture() -> Outcome {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
    for (tracking, says, mode) in [(true, "event tracking", MODES[0]), (false, "Nvfp4Linear::forward cannot be captured", MODES[0]), (true, "event tracking", MODES[1]), (false, "Nvfp4Linear::forward cannot be captured", MODES[1])] {
        let d = device(true)?;
        let stream = d.as_cuda_device().unwrap().cuda_stream();
        if !tracking {
            // SAFETY: every buffer below is made after this and used on the device's one stream.
            unsafe { stream.context().disable_event_tracking() };
        }
        let (n, k) = (256, 512);
        let (w, layer) = make_layer(&d, n, k, 44, mode);
        let (x, x0) = (randn(&d, &[4, k], DType::BF16), Tensor::zeros((0, k), DType::BF16, &d).unwrap());
        check::<half::bf16>(&layer, &w, &x, "before the capture");
        d.synchronize().unwrap();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
        let got = layer.forward(&x);
        // An empty batch allocates its output too.
        let empty = layer.forward(&x0);
        let status = stream.capture_status().unwrap();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let msg = got.expect_err("a forward during capture was accepted").to_string();
        println!("  during capture, {mode:?}, event tracking {tracking}: {}", msg.lines().next().unwrap_or(""));
        assert!(msg.contains(says), "event tracking {tracking}: the error does not say {says:?}: {msg}");
        let msg = empty.expect_err("an empty forward during capture was accepted").to_string();
        assert!(msg.contains(says), "event tracking {tracking}, empty batch: the error does not say {says:?}: {msg}");
        assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "the forward invalidated the capture");
        assert!(ended.is_ok(), "end_capture: {:?}", ended.err());
        check::<half::bf16>(&layer, &w, &x, "after the capture");
    }
    Ok(())
}

/// Shapes off the beaten path: a 1-D input (one row), N and K that are small and not powers of
/// two, and inputs far beyond the range the input scale is for (block scales saturate at 448).
fn candle_forward_odd_shapes_and_saturation() -> Outcome {
    let d = device(false)?;
    let (n, k) = (40, 96);
    for mode in MODES {
        let (w, layer) = make_layer(&d, n, k, 45, mode);
        check::<half::bf16>(&layer, &w, &randn(&d, &[k], DType::BF16), "a 1-D input");
        check::<half::f16>(&layer, &w, &randn(&d, &[7, k], DType::F16), "[7, 96] x [40, 96]");
        let big = (randn(&d, &[5, k], DType::F32) * 1000.0).unwrap().to_dtype(DType::BF16).unwrap();
        check::<half::bf16>(&layer, &w, &big, "inputs 1000x the input scale's range");
    }
    Ok(())
}

/// A layer as an engine makes it from a checkpoint file (ModelOpt's and compressed-tensors' names,
/// the latter's reciprocal scales), converted on the GPU: in both modes its forward matches the
/// reference on the host conversion of the same file; a file without an input scale makes a
/// W4A16 layer.
fn candle_forward_from_checkpoint() -> Outcome {
    use blockscaled_gemm::checkpoint::Checkpoint;
    use safetensors::{tensor::TensorView, Dtype};
    let d = device(false)?;
    let cd = d.as_cuda_device().unwrap();
    let (n, k) = (320, 1024);
    let w = Nvfp4Matrix::random_realistic((1, n, k), 46).unwrap();
    let rm = blockscaled_gemm::layout::from_tiled(w.scales(), (1, n, k / 16)).unwrap();
    let prefix = "model.layers.0.mlp.down_proj";
    // (names, weight scale, input scale as stored): ModelOpt multiplies by them, compressed-tensors
    // divides; the last file has no input scale, as a W4A16 export need not.
    let conventions = [
        (["weight", "weight_scale", "weight_scale_2", "input_scale"], 0.01f32, Some(INPUT_SCALE)),
        (["weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"], 100.0, Some(448.0)),
        (["weight", "weight_scale", "weight_scale_2", ""], 0.01, None),
    ];
    for (i, (names, ws, is)) in conventions.into_iter().enumerate() {
        let (ws, is) = (ws.to_le_bytes(), is.map(f32::to_le_bytes));
        let mut tensors = vec![(names[0], Dtype::U8, vec![n, k / 2], w.data()), (names[1], Dtype::F8_E4M3, vec![n, k / 16], &rm[..]), (names[2], Dtype::F32, vec![], &ws[..])];
        if let Some(is) = &is {
            tensors.push((names[3], Dtype::F32, vec![], &is[..]));
        }
        let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(name, dt, shape, bytes)| (format!("{prefix}.{name}"), TensorView::new(*dt, shape.clone(), bytes).unwrap())).collect();
        let path = std::env::temp_dir().join(format!("bsg-gpu-candle-ck-{}-{i}.safetensors", std::process::id()));
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
        let ck = Checkpoint::open(&path).unwrap();
        let host = ck.layer(prefix).unwrap();
        let (t, input_scale) = ck.layer_to_device(prefix, &cd.cuda_stream()).unwrap();
        let (t2, _) = ck.layer_to_device(prefix, &cd.cuda_stream()).unwrap();
        std::fs::remove_file(&path).ok();
        let mut layers = vec![Nvfp4Linear::w4a16(t2, cd).unwrap()];
        if is.is_some() {
            assert_eq!(input_scale, Some(INPUT_SCALE), "{}: the input scale in this crate's convention", names[0]);
            layers.push(Nvfp4Linear::new(t, input_scale.unwrap(), cd).unwrap());
        } else {
            assert_eq!(input_scale, None, "a file without an input scale");
        }
        for layer in &layers {
            for m in [1, 40] {
                check::<half::bf16>(layer, &host.weight, &randn(&d, &[m, k], DType::BF16), &format!("file {i} ({}) [{m}, {k}]", names[0]));
            }
        }
    }
    Ok(())
}


/// Expert factors of the experts' cases (a checkpoint's per-expert weight global scales).
const EXPERT_SCALES: [f32; 4] = [1.0, 0.5, 2.0, 0.25];

/// An (E, N, K) weight of `EXPERT_SCALES.len()` experts and an experts layer over it on `d`.
fn make_experts(d: &Device, n: usize, k: usize, seed: u64, mode: LinearMode) -> (Nvfp4Matrix, Nvfp4Experts) {
    let w = Nvfp4Matrix::random_realistic((EXPERT_SCALES.len(), n, k), seed).unwrap();
    let cd = d.as_cuda_device().unwrap();
    let layer = Nvfp4Experts::from_matrix(&w, &EXPERT_SCALES, mode, cd).unwrap();
    (w, layer)
}

/// The device address of a contiguous tensor's first element.
fn address<T: candle_core::cuda::CudaDType>(t: &Tensor) -> u64 {
    use blockscaled_gemm::cudarc::driver::DevicePtr;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cuda(c) = &*storage else { panic!("not a CUDA tensor") };
    let slice = c.as_cuda_slice::<T>().unwrap();
    let (at, _guard) = slice.device_ptr(slice.stream());
    at + (layout.start_offset() * std::mem::size_of::<T>()) as u64
}

/// `layer.forward(x, offsets)` judged expert by expert, as [`check`] judges a dense forward (each
/// expert's rows against the reference of the mode with that expert's weight and factor), and
/// the rows no expert covers (offsets short of T) 0. The forward's output is allocated
/// uninitialised: just before it a tensor of the output's size filled with ones is dropped, so
/// that the output, the forward's first allocation, most likely takes that memory (cudarc
/// allocates from CUDA's stream-ordered memory pool, which hands a freed block back to the next
/// allocation of its size on the stream). Returns whether it did: the zeros of
/// uncovered rows were then written over ones, not found in fresh memory.
fn check_experts<T: Activation16 + WithDType + HostFloat + candle_core::cuda::CudaDType>(d: &Device, layer: &Nvfp4Experts, w: &Nvfp4Matrix, x: &Tensor, offsets: &[i32], what: &str) -> bool {
    let what = &format!("{:?}: {what}", layer.mode());
    let o = Tensor::new(offsets, d).unwrap();
    let mut out_dims = x.dims().to_vec();
    *out_dims.last_mut().unwrap() = w.rows();
    let poisoned_at = address::<T>(&Tensor::ones(out_dims, x.dtype(), d).unwrap());
    let y = layer.forward(x, &o).unwrap_or_else(|e| panic!("{what}: forward: {e}"));
    let on_poison = address::<T>(&y) == poisoned_at;
    let (n, k) = (w.rows(), w.k());
    let mut want = x.dims().to_vec();
    *want.last_mut().unwrap() = n;
    assert_eq!(y.dims(), &want[..], "{what}: output shape");
    assert_eq!(y.dtype(), x.dtype(), "{what}: output dtype");
    let xs: Vec<T> = x.flatten_all().unwrap().to_vec1().unwrap();
    let got: Vec<T> = y.flatten_all().unwrap().to_vec1().unwrap();
    let rows = xs.len() / k;
    let mut covered = vec![false; rows];
    for e in 0..offsets.len() - 1 {
        let (r0, r1) = (offsets[e] as usize, offsets[e + 1] as usize);
        if r0 == r1 {
            continue;
        }
        covered[r0..r1].iter_mut().for_each(|c| *c = true);
        let we = w.batch_slice(e).unwrap();
        let v = layer.mode().verify(&xs[r0 * k..r1 * k], &we, EXPERT_SCALES[e], &got[r0 * n..r1 * n]).unwrap();
        judge(&v, &format!("{what}: expert {e} (rows {r0}..{r1})"));
    }
    for (r, _) in covered.iter().enumerate().filter(|(_, c)| !**c) {
        assert!(got[r * n..(r + 1) * n].iter().all(|&v| WithDType::to_f64(v) == 0.0), "{what}: row {r}, which no expert covers, is not 0");
    }
    on_poison
}

/// Offsets of `counts` rows an expert, as i32.
fn offsets_of(counts: &[usize]) -> Vec<i32> {
    blockscaled_gemm::grouped::expert_offsets(counts).unwrap()
}

/// The experts layer in both modes: routings with an empty expert, stream tiles (few rows an
/// expert) and the swapped tiles (from 33 an expert on average), bf16 and f16, a 3-D input, and
/// the same layer used again with fewer rows (its kept buffers' prefix).
fn candle_experts_forward() -> Outcome {
    let d = device(false)?;
    let (n, k) = (256, 512);
    for mode in MODES {
        let (w, layer) = make_experts(&d, n, k, 51, mode);
        for counts in [[3, 0, 40, 17], [130, 1, 0, 2], [1, 1, 1, 1], [200, 50, 64, 7], [2, 0, 0, 1]] {
            let o = offsets_of(&counts);
            let t = counts.iter().sum::<usize>();
            check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[t, k], DType::BF16), &o, &format!("bf16 {counts:?}"));
            check_experts::<half::f16>(&d, &layer, &w, &randn(&d, &[t, k], DType::F16), &o, &format!("f16 {counts:?}"));
        }
        let o = offsets_of(&[10, 20, 0, 10]);
        check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[2, 20, k], DType::BF16), &o, "[2, 20, K]");
        // An empty batch: no rows in, none out.
        let y = layer.forward(&Tensor::zeros((0, k), DType::F16, &d).unwrap(), &Tensor::new(&[0i32; 5], &d).unwrap()).unwrap();
        assert_eq!((y.dims(), y.dtype()), (&[0, n][..], DType::F16));
        // Offsets read from inside a larger tensor (a view with a start), rows from a view too.
        let o_big = Tensor::new(&[7i32, 7, 0, 5, 9, 30, 31, 0], &d).unwrap();
        let x_big = randn(&d, &[40, k], DType::BF16);
        let o = o_big.narrow(0, 2, 5).unwrap();
        let y = layer.forward(&x_big.narrow(0, 3, 31).unwrap(), &o).unwrap();
        let want = layer.forward(&x_big.narrow(0, 3, 31).unwrap().contiguous().unwrap().copy().unwrap(), &Tensor::new(&[0i32, 5, 9, 30, 31], &d).unwrap()).unwrap();
        assert_same_bits(&y, &want, &format!("{mode:?}: views against copies"));
        check_experts::<half::bf16>(&d, &layer, &w, &x_big.narrow(0, 3, 31).unwrap(), &[0, 5, 9, 30, 31], "views");
    }
    Ok(())
}

/// One experts layer used by four threads at once, on a per-thread-stream device (a lane per
/// thread) and on a device with a stream of its own (one lane, its buffers shared under the
/// lock), each forward exact.
fn candle_experts_threads() -> Outcome {
    for own_stream in [false, true] {
        let d = device(own_stream)?;
        let (n, k) = (256, 512);
        for mode in MODES {
            let (w, layer) = make_experts(&d, n, k, 54, mode);
            std::thread::scope(|scope| {
                let hs: Vec<_> = (0..4usize)
                    .map(|t| {
                        let (d, w, layer) = (&d, &w, &layer);
                        scope.spawn(move || {
                            for round in 0..3 {
                                let counts = [[1, 2, 0, 5], [40, 0, 90, 7], [3, 3, 3, 3], [0, 0, 0, 150]][(t + round) % 4];
                                let x = randn(d, &[counts.iter().sum(), k], DType::BF16);
                                check_experts::<half::bf16>(d, layer, w, &x, &offsets_of(&counts), &format!("own stream {own_stream}, thread {t} round {round} {counts:?}"));
                            }
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().expect("a thread's forward failed");
                }
            });
        }
    }
    Ok(())
}

/// A forward while the layer's stream captures is refused (the layer's `NotCapturable` with
/// event tracking off), the capture left active, and the layer works after it.
fn candle_experts_during_capture() -> Outcome {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
    for mode in MODES {
        let d = device(true)?;
        let stream = d.as_cuda_device().unwrap().cuda_stream();
        // SAFETY: every buffer below is made after this and used on the device's one stream.
        unsafe { stream.context().disable_event_tracking() };
        let (n, k) = (256, 512);
        let (w, layer) = make_experts(&d, n, k, 55, mode);
        let (x, o) = (randn(&d, &[12, k], DType::BF16), [0i32, 3, 6, 6, 12]);
        check_experts::<half::bf16>(&d, &layer, &w, &x, &o, "before the capture");
        let ot = Tensor::new(&o, &d).unwrap();
        d.synchronize().unwrap();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).unwrap();
        let got = layer.forward(&x, &ot);
        let status = stream.capture_status().unwrap();
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let msg = got.expect_err("a forward during capture was accepted").to_string();
        println!("  during capture, {mode:?}: {}", msg.lines().next().unwrap_or(""));
        assert!(msg.contains("Nvfp4Experts::forward cannot be captured"), "{mode:?}: {msg}");
        assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, "the forward invalidated the capture");
        assert!(ended.is_ok(), "end_capture: {:?}", ended.err());
        check_experts::<half::bf16>(&d, &layer, &w, &x, &o, "after the capture");
    }
    Ok(())
}

/// Offsets that do not cover every row, and offsets out of order or past T: each expert covers
/// the rows of the offsets' running maximum clamped to [0, T] (as `moe_gemm` reads them), and
/// every other row is 0.
fn candle_experts_uncovered_rows() -> Outcome {
    let d = device(false)?;
    let (n, k, t) = (128, 256, 30);
    for mode in MODES {
        let (w, layer) = make_experts(&d, n, k, 52, mode);
        // Each routing twice: a margin against the pool handing out another block once.
        let mut on_poison = [false; 4];
        for _ in 0..2 {
            // Rows 20..30 in no expert.
            on_poison[0] |= check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[t, k], DType::BF16), &[0, 3, 3, 10, 20], "rows 20.. uncovered");
            // Rows 0..4 in none (the first offset 4), expert 1 empty.
            on_poison[1] |= check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[t, k], DType::BF16), &[4, 8, 8, 12, 30], "rows ..4 uncovered");
            // The swapped tiles (50 rows an expert on average) with rows 180..200 uncovered, then
            // rows ..20 (the first offset 20).
            on_poison[2] |= check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[200, k], DType::BF16), &[0, 50, 100, 150, 180], "200 rows, 180.. uncovered");
            on_poison[3] |= check_experts::<half::bf16>(&d, &layer, &w, &randn(&d, &[200, k], DType::BF16), &[20, 70, 120, 170, 200], "200 rows, ..20 uncovered");
        }
        // The zeros must have been written over ones at least once per tile family, else the
        // check above could pass on fresh memory that happened to be zero.
        assert!(on_poison[0] || on_poison[1], "{mode:?}: no stream-tile forward's output took the poisoned block: the allocator's reuse assumed here does not hold");
        assert!(on_poison[2] || on_poison[3], "{mode:?}: no swapped-tile forward's output took the poisoned block: the allocator's reuse assumed here does not hold");
        // Offsets out of order and past T, as the device reads them.
        let x = randn(&d, &[t, k], DType::BF16);
        let y = layer.forward(&x, &Tensor::new(&[0i32, 12, 5, 99, 40], &d).unwrap()).unwrap();
        let clamped = [0i32, 12, 12, 30, 30];
        let want = layer.forward(&x, &Tensor::new(&clamped, &d).unwrap()).unwrap();
        assert_same_bits(&y, &want, &format!("{mode:?}: invalid offsets against their clamped running maximum"));
        check_experts::<half::bf16>(&d, &layer, &w, &x, &clamped, "clamped offsets");
    }
    Ok(())
}

/// What the experts layer cannot take: each an error from `new` or `forward` that says why.
fn candle_experts_refusals() -> Outcome {
    let d = device(false)?;
    let cd = d.as_cuda_device().unwrap();
    let (n, k) = (128, 256);
    let w = Nvfp4Matrix::random_realistic((4, n, k), 53).unwrap();
    let up = || Nvfp4Tensor::upload(&w, &cd.cuda_stream()).unwrap();
    for mode in MODES {
        refused(Nvfp4Experts::new(up(), &[1.0; 3], mode, cd), "three scales for four experts", "one each");
        refused(Nvfp4Experts::new(up(), &[1.0, f32::NAN, 1.0, 1.0], mode, cd), "a NaN expert scale", "expert 1");
        refused(Nvfp4Experts::new(up(), &[1.0, 1.0, 0.0, 1.0], mode, cd), "a zero expert scale", "expert 2");
        // An expert's factor times the weight's global scale (1e30) and the input scale (1/448
        // or 1) out of f32's range.
        let (v, sc) = up().into_parts();
        let big = Nvfp4Tensor::new::<u8, u8>(v, sc, (4, n, k), 1e30).unwrap();
        refused(Nvfp4Experts::new(big, &[1.0, 1.0, 1.0, 1e12], mode, cd), "an expert scale whose product overflows", "alpha");
    }
    // The input and weight scales' product (alpha, folded on the host) overflowing, whatever the
    // experts' factors would bring it back to.
    let (v, sc) = up().into_parts();
    let big = Nvfp4Tensor::new::<u8, u8>(v, sc, (4, n, k), 1e30).unwrap();
    refused(Nvfp4Experts::new(big, &[1e-12; 4], LinearMode::Nvfp4 { input_scale: 1e10 }, cd), "alpha overflowing before the experts' factors", "alpha");
    refused(Nvfp4Experts::new(up(), &EXPERT_SCALES, LinearMode::Nvfp4 { input_scale: -1.0 }, cd), "a negative input scale", "global scale");
    let other = Device::new_cuda(0).unwrap();
    for mode in MODES {
        let layer = Nvfp4Experts::new(up(), &EXPERT_SCALES, mode, cd).unwrap();
        let x = randn(&d, &[8, k], DType::BF16);
        let good = Tensor::new(&[0i32, 2, 4, 6, 8], &d).unwrap();
        let cases: Vec<(&str, Tensor, Tensor, &str)> = vec![
            ("u32 offsets", x.clone(), Tensor::new(&[0u32, 2, 4, 6, 8], &d).unwrap(), "i32 wanted"),
            ("E offsets, not E + 1", x.clone(), Tensor::new(&[0i32, 2, 4, 8], &d).unwrap(), "[E + 1]"),
            ("2-D offsets", x.clone(), Tensor::new(&[[0i32, 2, 4, 6, 8]], &d).unwrap(), "[E + 1]"),
            ("offsets on the CPU", x.clone(), Tensor::new(&[0i32, 2, 4, 6, 8], &Device::Cpu).unwrap(), "device"),
            ("offsets on another candle device", x.clone(), Tensor::new(&[0i32, 2, 4, 6, 8], &other).unwrap(), "another candle CudaDevice"),
            ("strided offsets", x.clone(), Tensor::new(&[0i32, 9, 2, 9, 4, 9, 6, 9, 8, 9], &d).unwrap().reshape((5, 2)).unwrap().narrow(1, 0, 1).unwrap().squeeze(1).unwrap(), "contiguous"),
            ("wrong K", randn(&d, &[8, k + 16], DType::BF16), good.clone(), "last dimension"),
            ("f32 input", randn(&d, &[8, k], DType::F32), good.clone(), "dtype"),
            ("input on another candle device", randn(&other, &[8, k], DType::BF16), good.clone(), "another candle CudaDevice"),
            // One bf16 element into its buffer: 2-byte aligned, not 16.
            ("misaligned input view", randn(&d, &[8 * k + 1], DType::BF16).narrow(0, 1, 8 * k).unwrap().reshape((8, k)).unwrap(), good.clone(), "is not 16-byte aligned"),
        ];
        for (what, x, o, says) in cases {
            match layer.forward(&x, &o) {
                Ok(y) => panic!("{mode:?}: {what}: accepted (output {:?})", y.dims()),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(says), "{mode:?}: {what}: the error does not say {says:?}: {msg}");
                    println!("  {mode:?}: {what}: {}", msg.lines().next().unwrap_or(""));
                }
            }
        }
        // Still works after every refusal.
        check_experts::<half::bf16>(&d, &layer, &w, &x, &[0, 2, 4, 6, 8], "after the refusals");
    }
    Ok(())
}
