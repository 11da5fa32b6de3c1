//! Times the exact CPU reference on the shapes issue 3 names; prints one line per shape.
//! `cargo run --release --example reference_speed [M N K ...]`
use blockscaled_gemm::{reference_gemm, Nvfp4Matrix};
use std::time::Instant;

fn main() -> Result<(), blockscaled_gemm::Error> {
    let args: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("integers M N K ...")).collect();
    let shapes: Vec<[usize; 3]> = if args.is_empty() {
        vec![[128, 7168, 2048], [512, 4096, 7168]]
    } else {
        args.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect()
    };
    println!("threads: {}", rayon::current_num_threads());
    for [m, n, k] in shapes {
        let a = Nvfp4Matrix::random_contest((1, m, k), 1)?;
        let b = Nvfp4Matrix::random_contest((1, n, k), 2)?;
        let t = Instant::now();
        let d: Vec<half::f16> = reference_gemm(&a, &b, 1.0, 0.0, None)?;
        let s = t.elapsed().as_secs_f64();
        println!("{m}x{n}x{k}: {s:.2} s ({:.2} GMAC/s), d[0] = {}", (m * n * k) as f64 / s / 1e9, d[0]);
    }
    Ok(())
}
