//! The grouped (MoE and list-form) host helpers under bad inputs (from an adversarial review,
//! 2026-11-28), on the CPU. The grouped calls on a GPU, with poisoned outputs:
//! tests/gpu_refusals.rs.
use blockscaled_gemm::cutlass_host::describe_grouped;
use blockscaled_gemm::grouped::{check_offsets, expert_offsets, moe_scale_starts, moe_scales, reference_moe, MAX_EXPERTS};
use blockscaled_gemm::{Config, Error, MoeProblem, Nvfp4Matrix, OutType};

#[test]
fn cpu_describe_grouped_past_sm100_limit_is_typed() {
    let c = Config::Sm100_1Sm_128x128x256;
    if !c.is_built_grouped(OutType::F16) {
        println!("skipped: no SM100 grouped kernel in this build");
        return;
    }
    // Past SM100's scale-layout limit (A's scales over T rows), where validate passes.
    let rows = (i32::MAX as usize / 512 / 112) * 128 + 1;
    let p = MoeProblem::new(rows, 128, 7168, 1);
    p.validate(OutType::F16).unwrap();
    assert!(p.check_sm100(OutType::F16).is_err());
    let e = describe_grouped(c, OutType::F16, &p, &[0, rows as i32], None, 0).unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::SizeLimit { .. }), "{e:?}");
}

/// Host offsets: every rule named; values at the i32 edges; a row count past i32 never matches.
#[test]
fn cpu_offsets_edges() {
    for (o, t) in [
        (vec![0, -1, 5], 5usize),
        (vec![i32::MIN, 0, 5], 5),
        (vec![0, i32::MAX, 5], 5),
        (vec![0, 5, i32::MIN], 5),
        (vec![0, 3], 2),
        (vec![0, 2], usize::MAX),
        (vec![0, -1], usize::MAX),
        (vec![0, 0], (1usize << 32)),
        (vec![0], 0),
        (vec![], 0),
    ] {
        let e = check_offsets(&o, t).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "offsets", .. }), "{o:?} {t}: {e:?}");
        // moe_scale_starts takes T from the last offset: it accepts exactly the well-formed ones.
        let well_formed = o.len() >= 2 && o[0] == 0 && o.windows(2).all(|w| w[0] <= w[1]);
        assert_eq!(moe_scale_starts(&o).is_ok(), well_formed, "{o:?}");
    }
    check_offsets(&[0, 0, 0], 0).unwrap();
    check_offsets(&[0, i32::MAX], i32::MAX as usize).unwrap();
    assert_eq!(moe_scale_starts(&[0, i32::MAX]).unwrap(), vec![0, (i32::MAX as usize).div_ceil(128) * 128]);
    assert!(check_offsets(&vec![0; MAX_EXPERTS + 1], 0).is_ok());
    assert!(check_offsets(&vec![0; MAX_EXPERTS + 2], 0).is_err());
    // Counts past i32 in total.
    assert!(matches!(expert_offsets(&[i32::MAX as usize, 1]), Err(Error::InvalidData { .. })));
    assert!(matches!(expert_offsets(&[usize::MAX, usize::MAX]), Err(Error::InvalidData { .. })));
    assert_eq!(expert_offsets(&[]).unwrap(), vec![0]);
    // Zero-row experts and every expert empty but one.
    let x = Nvfp4Matrix::random_contest((1, 3, 64), 9).unwrap();
    let s = moe_scales(&x, &[0, 0, 3, 3]).unwrap();
    assert_eq!(s.len(), MoeProblem::new(3, 32, 64, 3).sfa_bytes());
    // x batched: refused by both host helpers (typed).
    let xb = Nvfp4Matrix::random_contest((2, 3, 64), 9).unwrap();
    assert!(matches!(moe_scales(&xb, &[0, 3]), Err(Error::InvalidData { what: "x", .. })));
    let w = Nvfp4Matrix::random_contest((1, 32, 64), 10).unwrap();
    assert!(reference_moe::<f32>(&xb, &w, &[0, 3], &[1.0], 1.0).is_err());
    // Expert scales of the wrong count, and w of the wrong K.
    assert!(reference_moe::<f32>(&x, &w, &[0, 3], &[1.0, 1.0], 1.0).is_err());
    let wk = Nvfp4Matrix::random_contest((1, 32, 128), 10).unwrap();
    assert!(reference_moe::<f32>(&x, &wk, &[0, 3], &[1.0], 1.0).is_err());
}

/// A MoE problem's dimension errors name T where the dense rules they reuse say M (the size-limit
/// errors still print the dense problem they checked), and a dimension with no upper bound says
/// only that it must be at least 1.
#[test]
fn cpu_moe_errors_name_t_and_e() {
    let e = MoeProblem::new(1usize << 31, 128, 256, 4).validate(OutType::F16).unwrap_err();
    assert!(matches!(e, Error::Dimension { dim: "T", .. }), "{e:?}");
    assert!(e.to_string().starts_with("T = 2147483648: must be at least 1 and at most "), "{e}");
    let e = MoeProblem::new(8, 0, 256, 4).validate(OutType::F16).unwrap_err();
    assert!(matches!(e, Error::Dimension { dim: "N", .. }), "{e:?}");
    let e = Error::Dimension { dim: "K", value: 0, max: usize::MAX };
    assert_eq!(e.to_string(), "K = 0: must be at least 1");
}
