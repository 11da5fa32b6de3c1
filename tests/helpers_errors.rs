//! The public host helpers (layouts, packing, row selection, comparison, the FP4 epilogue, the
//! dispatch rules) answer bad lengths, indexes and sizes with a typed error naming the value and
//! the rule, never a panic or a silently wrong result.
use blockscaled_gemm::compare::{compare, compare_fp4};
use blockscaled_gemm::formats::pack_e2m1_slice;
use blockscaled_gemm::layout::{from_tiled, prepack_values, prepacked_bytes, to_tiled, unpack_values};
use blockscaled_gemm::dispatch::{select as select_config, split_k as config_split_k};
use blockscaled_gemm::{fp4_out, Config, Error, Nvfp4Matrix, OutType, Problem, SfdFormat, ANY_CLUSTERS};

#[test]
fn scale_layouts_check_lengths_and_sizes() {
    let e = to_tiled(&[1; 5], (1, 2, 3)).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "row-major scales", got: 5, want: 6, .. }), "{e}");
    let e = to_tiled(&[], (2, usize::MAX, 2)).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { what: "row-major scales", .. }), "{e}");
    let e = to_tiled(&[], (usize::MAX, 1, 1)).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { what: "tiled scale bytes", .. }), "{e}");
    let e = from_tiled(&[0; 511], (1, 1, 1)).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "tiled scales", got: 511, want: 512, .. }), "{e}");
    let e = from_tiled(&[], (64, usize::MAX / 64, 1)).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { what: "tiled scale bytes", .. }), "{e}");
    // No scale columns: nothing to move, however many rows (no loop over them, no overflow).
    assert_eq!(to_tiled(&[], (2, usize::MAX, 0)).unwrap(), Vec::<u8>::new());
    assert_eq!(from_tiled(&[], (2, usize::MAX, 0)).unwrap(), Vec::<u8>::new());
    // And the round trip where the lengths are right.
    let sf: Vec<u8> = (0..2 * 3 * 5).map(|i| i as u8).collect();
    assert_eq!(from_tiled(&to_tiled(&sf, (2, 3, 5)).unwrap(), (2, 3, 5)).unwrap(), sf);
}

#[test]
fn value_layouts_check_k_and_lengths() {
    let e = prepack_values(&[0; 3], (1, 2, 3)).unwrap_err();
    assert!(matches!(e, Error::KMultiple { k: 3, multiple: 2, .. }), "{e}");
    let e = prepack_values(&[0; 7], (1, 2, 8)).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "values", got: 7, want: 8, .. }), "{e}");
    // A product that wraps in usize is a size error, not a length that happens to match.
    let e = prepack_values(&[], (4, 1 << 62, 8)).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { .. }), "{e}");
    // K = 0: no values, however many rows.
    assert_eq!(prepack_values(&[], (2, usize::MAX, 0)).unwrap(), Vec::<u8>::new());
    assert_eq!(unpack_values(&[], (2, usize::MAX, 0)).unwrap(), Vec::<u8>::new());
    let e = unpack_values(&[0; 100], (1, 2, 8)).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "values", got: 100, .. }), "{e}");
    let values: Vec<u8> = (0..3 * 300).map(|i| (i * 7) as u8).collect();
    let packed = prepack_values(&values, (1, 3, 600)).unwrap();
    assert_eq!(packed.len(), prepacked_bytes((1, 3, 600)));
    assert_eq!(unpack_values(&packed, (1, 3, 600)).unwrap(), values);
}

#[test]
fn packing_odd_codes_is_an_error() {
    let e = pack_e2m1_slice(&[1, 2, 3]).unwrap_err();
    assert!(e.to_string().contains("3 given"), "{e}");
    assert_eq!(pack_e2m1_slice(&[1, 2]).unwrap(), vec![0x21]);
}

#[test]
fn row_and_batch_selection_check_their_indexes() {
    let m = Nvfp4Matrix::random_contest((2, 5, 32), 7).unwrap();
    let e = m.select_rows(&[0, 5]).unwrap_err();
    assert!(matches!(e, Error::Index { what: "row", index: 5, len: 5 }), "{e}");
    let e = m.select_rows(&[]).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "rows", .. }), "{e}");
    let e = m.batch_slice(2).unwrap_err();
    assert!(matches!(e, Error::Index { what: "batch", index: 2, len: 2 }), "{e}");
    let picked = m.select_rows(&[4, 0]).unwrap();
    assert_eq!((0..32).map(|k| picked.code(1, 0, k)).collect::<Vec<_>>(), (0..32).map(|k| m.code(1, 4, k)).collect::<Vec<_>>());
    assert_eq!(m.batch_slice(1).unwrap().scale(0, 3, 1), m.scale(1, 3, 1));
}

#[test]
fn element_accessors_refuse_indexes_past_their_extent() {
    // Unchecked, each of these reads another element's bytes: (row 0, K index 32) of a 32-wide
    // matrix is row 1's first code, row 2 of a 2-row batch is the next batch's first row, row 2's
    // scales are the tile's padding.
    let m = Nvfp4Matrix::random_contest((2, 2, 32), 3).unwrap();
    assert!(std::panic::catch_unwind(|| m.code(0, 0, 32)).is_err());
    assert!(std::panic::catch_unwind(|| m.value(0, 2, 0)).is_err());
    assert!(std::panic::catch_unwind(|| m.scale(0, 2, 0)).is_err());
    assert!(std::panic::catch_unwind(|| m.scale(0, 0, 2)).is_err());
    // The get_ forms answer None where those panic, and the element where they do not.
    assert_eq!((m.get_code(0, 0, 32), m.get_value(0, 2, 0), m.get_scale(0, 2, 0), m.get_scale(0, 0, 2)), (None, None, None, None));
    assert_eq!(m.get_code(1, 1, 31), Some(m.code(1, 1, 31)));
    assert_eq!(m.get_value(1, 1, 31).map(f32::to_bits), Some(m.value(1, 1, 31).to_bits()));
    assert_eq!(m.get_scale(1, 1, 1), Some(m.scale(1, 1, 1)));
}

#[test]
fn comparisons_check_lengths() {
    let e = compare(&[1.0f32, 2.0], &[1.0f32], 0.0, 0.0).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "got", got: 2, want: 1, .. }), "{e}");
    let d = [0u8; 16];
    for n in [0, 24] {
        let e = compare_fp4(&d, &[1, 1], &d, &[1, 1], n, SfdFormat::Ue4m3).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "n", .. }), "{e}");
    }
    // 16 bytes are one row of 32 values: two scale factors, not three.
    let e = compare_fp4(&d, &[1, 1, 1], &d, &[1, 1, 1], 32, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "got_sfd", got: 3, want: 2, .. }), "{e}");
    let e = compare_fp4(&d, &[1, 1], &d[..8], &[1, 1], 32, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "want_d", got: 8, want: 16, .. }), "{e}");
    let e = compare_fp4(&d[..12], &[1], &d[..12], &[1], 32, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "got_d", .. }), "{e}");
    assert!(compare_fp4(&d, &[1, 1], &d, &[1, 1], 32, SfdFormat::Ue4m3).unwrap().byte_equal());
}

#[test]
fn fp4_epilogue_checks_n_and_its_inputs() {
    let p = Problem::new(2, 32, 64).scalars(1.0, 0.5);
    let acc = vec![1.0f32; 64];
    let e = fp4_out::epilogue(&p, &acc[..63], None, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "accumulators", got: 63, want: 64, .. }), "{e}");
    // beta != 0 reads C: a short C is an error, not an index past its end.
    let e = fp4_out::epilogue(&p, &acc, Some(&acc[..10]), SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "C", got: 10, want: 64, .. }), "{e}");
    // beta != 0 without C would drop beta * C silently.
    let e = fp4_out::epilogue(&p, &acc, None, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::BetaWithoutC { .. }), "{e}");
    let e = fp4_out::epilogue(&Problem::new(2, 24, 64), &acc[..48], None, SfdFormat::Ue4m3).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "N", .. }), "{e}");
    // No outputs (N = 0): nothing to loop over, however many rows.
    let empty = Problem::new(usize::MAX, 0, 64);
    assert_eq!(fp4_out::epilogue(&empty, &[], None, SfdFormat::Ue4m3).unwrap(), (Vec::new(), Vec::new()));
    let (d, sfd) = fp4_out::epilogue(&p, &acc, Some(&acc), SfdFormat::Ue4m3).unwrap();
    assert_eq!((d.len(), sfd.len()), (32, p.sfd_bytes()));
}

#[test]
fn dispatch_rules_answer_empty_and_huge_problems() {
    // A zero dimension has no tiles: the rules answer as for one tile instead of dividing by zero.
    for p in [Problem::new(0, 4096, 7168), Problem::new(16, 0, 7168), Problem::new(128, 4096, 7168).batch(0)] {
        for out in OutType::ALL {
            for c in Config::ALL.iter().copied() {
                assert!((1..=16).contains(&config_split_k(c, &p, out, 132, &ANY_CLUSTERS)), "{c} {p:?} {out:?}");
            }
            let _ = select_config(90, &p, out, 132, &ANY_CLUSTERS, |_| true);
        }
    }
    for huge in [Problem::new(usize::MAX / 2, usize::MAX / 2, 1 << 20).batch(usize::MAX / 2), Problem::new(usize::MAX, usize::MAX, usize::MAX).batch(usize::MAX)] {
        for out in OutType::ALL {
            let _ = select_config(90, &huge, out, 132, &ANY_CLUSTERS, |_| true);
            let _ = select_config(100, &huge, out, 148, &ANY_CLUSTERS, |_| true);
        }
    }
}
