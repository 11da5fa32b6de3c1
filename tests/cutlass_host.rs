//! The Rust layout and validator against CUTLASS's own host code, and the machine code of every
//! kernel in the build. No GPU needed.
use blockscaled_gemm::cutlass_host::{can_implement, sf_offsets};
use blockscaled_gemm::layout::{sf_bytes, sf_offset_elem};
use blockscaled_gemm::{Config, OutType, Problem};
use std::process::Command;

fn built_configs() -> Vec<Config> {
    Config::ALL.iter().copied().filter(|c| c.info().outputs.iter().any(|o| c.is_built(*o))).collect()
}

#[test]
fn every_config_of_the_table_is_built() {
    let archs = env!("BSG_BUILT_ARCHS");
    for c in Config::ALL {
        if archs.split(',').any(|a| a == c.info().arch.to_string()) {
            for o in c.info().outputs {
                assert!(c.is_built(*o), "{c} {o} missing from a build of arch {}", c.info().arch);
            }
        }
    }
    assert!(!built_configs().is_empty(), "no kernel built (BSG_ARCHS = {archs})");
}

#[test]
fn cutlass_scale_layout_equals_rust_layout() {
    let shapes = [(1, 1, 16, 1), (128, 128, 256, 1), (130, 200, 96, 2), (77, 300, 64, 3), (256, 8, 1024, 1), (513, 129, 272, 2), (128, 7168, 2048, 1)];
    for c in built_configs() {
        for &(m, n, k, l) in &shapes {
            let p = Problem::new(m, n, k).batch(l);
            for (operand_b, rows) in [(false, m), (true, n)] {
                let (offs, cosize) = sf_offsets(c, &p, operand_b).unwrap();
                assert_eq!(cosize as usize, sf_bytes(rows, k, l), "{c} {m}x{n}x{k}x{l} B={operand_b}: cosize");
                let mut i = 0;
                for li in 0..l {
                    for s in 0..k / 16 {
                        for r in 0..rows {
                            let want = sf_offset_elem(li, r, s * 16, rows, k);
                            assert_eq!(offs[i] as usize, want, "{c} {m}x{n}x{k}x{l} B={operand_b}: row {r} col {s} batch {li}");
                            i += 1;
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn cutlass_can_implement_agrees_with_validation() {
    let mut checked = 0;
    let mut refused = 0;
    for c in built_configs() {
        for &out in c.info().outputs {
            for m in [1, 7, 128, 130, 256, 300] {
                for n in [4, 8, 12, 16, 24, 100, 128, 260, 384] {
                    for k in [16, 32, 48, 64, 96, 256, 272, 1024] {
                        for l in [1, 2, 3] {
                            let p = Problem::new(m, n, k).batch(l);
                            let ours = p.validate(out, false).is_ok();
                            let theirs = can_implement(c, out, &p).unwrap();
                            assert_eq!(ours, theirs, "{c} {out} M={m} N={n} K={k} L={l}: validator {ours}, CUTLASS {theirs}");
                            checked += 1;
                            refused += usize::from(!ours);
                        }
                    }
                }
            }
        }
    }
    assert!(refused > 0 && refused < checked, "the grid must hold both accepted and refused shapes");
    eprintln!("{checked} (config, output, shape) cases agree, {refused} refused by both");
}

#[test]
fn host_queries_refuse_bad_input() {
    let c = built_configs()[0];
    assert!(can_implement(c, OutType::F16, &Problem::new(0, 8, 32)).is_err());
    assert!(sf_offsets(c, &Problem::new(1usize << 31, 8, 32), false).is_err());
}

/// SM100 kernels whose SASS holds a block-scaled UMMA (UTC*MMA with a scale-vector suffix) and
/// the scale-factor copy into tensor memory (UTCCP); SM90 kernels with HGMMA.
#[test]
fn sass_has_block_scaled_umma() {
    let objs: Vec<&str> = env!("BSG_KERNEL_OBJECTS").split(';').filter(|s| !s.is_empty()).collect();
    let cuobjdump = env!("BSG_CUOBJDUMP");
    let (mut kernels, mut hopper) = (0, 0);
    for obj in &objs {
        let out = Command::new(cuobjdump).arg("-sass").arg(obj).output().expect("run cuobjdump");
        assert!(out.status.success(), "cuobjdump {obj}: {}", String::from_utf8_lossy(&out.stderr));
        let sass = String::from_utf8_lossy(&out.stdout);
        if obj.contains("bsg_entry_sm100") {
            let umma = sass.lines().filter(|l| l.contains("UTCOMMA") || l.contains("UTCQMMA") || l.contains("UTCMXQMMA")).filter(|l| l.contains(".4X") || l.contains(".2X")).count();
            let utccp = sass.lines().filter(|l| l.contains("UTCCP")).count();
            assert!(umma > 0, "{obj}: no block-scaled UMMA instruction");
            assert!(utccp > 0, "{obj}: no UTCCP (scale factors to tensor memory)");
            assert!(sass.contains("sm_100a") || sass.contains("SM100"), "{obj}: not sm_100a code");
            kernels += 1;
        }
        if obj.contains("bsg_entry_sm90") {
            // Hopper: FP16 warpgroup MMA fed by the on-chip e4m3 -> f16 decode.
            assert!(sass.contains("HGMMA"), "{obj}: no HGMMA");
            assert!(sass.contains("F2FP.F16.E4M3.UNPACK"), "{obj}: no e4m3x2 -> f16x2 decode");
            hopper += 1;
        }
    }
    eprintln!("{kernels} SM100 kernels with block-scaled UMMA, {hopper} SM90 kernels with HGMMA");
    let expected = |arch: u32| built_configs().iter().filter(|c| c.info().arch == arch).map(|c| c.info().outputs.len()).sum::<usize>();
    assert_eq!(kernels, expected(100));
    assert_eq!(hopper, expected(90));
}
