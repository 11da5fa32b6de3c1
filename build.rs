//! Builds the C++ shim: one nvcc translation unit per config of `cpp/configs.def`, with all its
//! dense, grouped and W4A16 kernels, each object cached by content hash outside `target/`, then
//! the cxx bridge with the host compiler, and static cudart.
//!
//! Environment: `NVCC` or `CUDA_HOME` (an installed toolkit instead of the pinned PyPI wheels),
//! `CUTLASS_DIR` (a CUTLASS checkout instead of the pinned wheel), `BSG_ARCHS` (comma list of
//! architectures to build, e.g. `sm100`), `BSG_CONFIGS` (comma list of config names to build, for
//! kernel experiments; the others report `NotBuilt`), `BSG_CACHE_DIR` (object and wheel cache, default
//! `~/.cache/blockscaled-gemm`), `BSG_NVCC_JOBS` (parallel nvcc processes; an SM100 unit takes up to 5 GiB),
//! `BSG_NVCC_DEFINES` (space-separated `NAME=VALUE` macros for experiments, e.g. the stage
//! switches of `cpp/common/instrument.cuh`; part of each object's cache key).

#[path = "build/cache.rs"]
mod cache;
#[path = "build/toolkit.rs"]
mod toolkit;

use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Architectures the table may name, and how nvcc builds each.
const ARCHES: &[(u32, &str, &str, &str, &[&str])] = &[
    // (arch, BSG_ARCHS name, -gencode, host adapter header, folders of `cpp/` its kernels include)
    (100, "sm100", "arch=compute_100a,code=sm_100a", "sm100/gemm.cuh", &["sm100"]),
    (90, "sm90", "arch=compute_90a,code=sm_90a", "sm90/gemm.cuh", &["sm90", "common"]),
];

/// Host-only translation units in `cpp/`, compiled by nvcc (they include CUTLASS headers).
const HOST_SOURCES: &[&str] = &["host/status.cu", "host/host_reference.cu"];


struct Config {
    name: String,
    arch: u32,
    sms: u32,
    tile: [u32; 3],
    cluster: [u32; 2],
    /// SM90: the main-loop schedule tag (`BSG_SM90_SCHEDULE`; `MainloopSmemDecode` by default).
    schedule: String,
    /// Outputs of its grouped (mixture-of-experts) kernels (`BSG_GROUPED`).
    grouped: Vec<String>,
    /// Outputs of its list-form grouped kernels (`BSG_GROUPED_LIST`).
    grouped_list: Vec<String>,
    /// Outputs of its W4A16 kernels (`BSG_W4A16`), each for f16 and bf16 activations.
    w4a16: Vec<String>,
}

/// W4A16 activation types: the name of kernel_abi.h's `InKind` and the CUTLASS type.
const W4A16_INPUTS: &[(&str, &str)] = &[("F16", "cutlass::half_t"), ("Bf16", "cutlass::bfloat16_t")];

/// SM90 main-loop schedules: the C++ tag and the Rust `Schedule` variant.
const SCHEDULES: &[(&str, &str)] = &[
    ("MainloopSmemDecode", "SmemDecode"),
    ("MainloopSwappedRegisterDecode", "SwappedRegisterDecode"),
    ("MainloopStreamWeights", "StreamWeights"),
    ("MainloopStreamWeightsShortK", "StreamWeightsShortK"),
];

struct Output {
    name: String,
    arches: Vec<u32>,
    cutlass_type: String,
    /// Config names, or `None` for all configs of `arches`.
    configs: Option<Vec<String>>,
}

impl Output {
    fn applies_to(&self, c: &Config) -> bool {
        self.arches.contains(&c.arch) && self.configs.as_ref().is_none_or(|list| list.contains(&c.name))
    }
}

fn main() {
    let root = PathBuf::from(env("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env("OUT_DIR").unwrap());
    for p in ["cpp", "include", "src/sys/bridge.rs", "third_party/pins.txt", "third_party/fetch.py", "build/toolkit.rs", "build/cache.rs"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    for v in ["NVCC", "CUDA_HOME", "CUTLASS_DIR", "BSG_ARCHS", "BSG_CONFIGS", "BSG_CACHE_DIR", "BSG_NVCC_JOBS", "BSG_NVCC_DEFINES", "NVCC_CCBIN", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "XDG_CACHE_HOME", "DOCS_RS", "LIBCLANG_PATH"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    // A toolkit or CUTLASS of the user's: cargo reruns this script when their files change (the
    // pinned wheels change only with pins.txt, watched above).
    for (var, parts) in [("CUTLASS_DIR", &["include", "tools/util/include"][..]), ("CUDA_HOME", &["bin/nvcc", "include"][..])] {
        if let Some(dir) = env(var) {
            for part in parts {
                println!("cargo:rerun-if-changed={}", Path::new(&dir).join(part).display());
            }
        }
    }

    let table = std::fs::read_to_string(root.join("cpp/configs.def")).expect("read cpp/configs.def");
    let abi = std::fs::read_to_string(root.join("include/blockscaled_gemm/kernel_abi.h")).expect("read kernel_abi.h");
    let out_names = abi_enum(&abi, "OutKind");
    let (configs, outputs) = parse_table(&table, &out_names);
    let archs = requested_archs(&configs);
    let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
    let only = env("BSG_CONFIGS").map(|v| toolkit::config_list(&v, &names).unwrap_or_else(|e| panic!("{e}")));
    let built = |c: &Config| archs.contains(&c.arch) && only.as_ref().is_none_or(|o| o.contains(&c.name.to_lowercase()));
    if env("DOCS_RS").is_some() {
        // Documentation only (docs.rs has no network and no nvcc): the Rust side of the table and
        // the ABI, no kernels, nothing to link. Every config then reports `NotBuilt`.
        std::fs::write(out_dir.join("configs.rs"), rust_table(&configs, &outputs, &[], &|_| false)).unwrap();
        // libclang: the pinned wheel where an earlier build fetched it (nothing is fetched here),
        // else the system's.
        let wheel_libclang = toolchain_dir(&root).join("libclang");
        generate_abi(&root, wheel_libclang.join("libclang.so").exists().then_some(wheel_libclang.as_path()), &out_dir);
        for k in ["BSG_CUOBJDUMP", "BSG_KERNEL_OBJECTS", "BSG_BUILT_ARCHS", "BSG_NVCC"] {
            println!("cargo:rustc-env={k}=");
        }
        return;
    }
    std::fs::write(out_dir.join("configs.rs"), rust_table(&configs, &outputs, &archs, &built)).unwrap();

    let tools = Toolchain::locate(&root);
    generate_abi(&root, tools.libclang_dir.as_deref(), &out_dir);
    let cache = cache_dir().join("objects");
    std::fs::create_dir_all(&cache).expect("create the object cache directory");

    // Everything a kernel object depends on besides its own generated source.
    let mut common = Sha256::new();
    common.update(tools.nvcc_version.as_bytes());
    common.update(tools.host_cxx_version.as_bytes());
    common.update(tools.cutlass_identity.as_bytes());
    // Every pinned wheel where the wheels build, else the user toolkit's ptxas and headers
    // (`Toolchain::wheel_pins`), and the flags nvcc takes from its environment.
    common.update(tools.wheel_pins.as_bytes());
    for v in ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"] {
        common.update(format!("{v}={}\0", env(v).unwrap_or_default()).as_bytes());
    }
    // The ABI header every kernel includes; each architecture adds the folders of `cpp/` its
    // kernels include (ARCHES), so a change to one architecture's parts rebuilds only its kernels.
    hash_tree(&mut common, &root.join("include"), &["h"]);
    let common = common.finalize();
    let arch_sources: Vec<(u32, Vec<u8>)> = ARCHES.iter().map(|(arch, _, _, _, dirs)| {
        let mut h = Sha256::new();
        for d in *dirs {
            h.update(d.as_bytes());
            hash_tree(&mut h, &root.join("cpp").join(d), &["cuh", "h"]);
        }
        (*arch, h.finalize().to_vec())
    }).collect();
    // SM100's grouped kernels also include `cpp/common/` (the experts' rows); its dense ones do not.
    let sm100_grouped_parts = {
        let mut h = Sha256::new();
        h.update(&arch_sources.iter().find(|a| a.0 == 100).unwrap().1);
        hash_tree(&mut h, &root.join("cpp/common"), &["cuh", "h"]);
        h.finalize().to_vec()
    };

    let gen_dir = out_dir.join("gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    let mut jobs = Vec::new(); // (source, object, gencode)
    // A generated translation unit: its source written under OUT_DIR, its object cached by the
    // hash of the source, the architecture's parts and the flags.
    let kernel_job = |func: &str, src: &str, gencode: &str, parts: &[u8]| {
        let flags = tools.nvcc_flags(&root, gencode);
        let key = object_key(&common, &[parts, src.as_bytes()], &flags);
        let src_path = gen_dir.join(format!("{func}.cu"));
        std::fs::write(&src_path, src).unwrap();
        (src_path, cache.join(format!("{func}-{}.o", &key[..24])), flags)
    };
    let mut table_inc = String::new();
    let mut grouped_inc = String::new();
    let mut grouped_list_inc = String::new();
    let mut w4a16_inc = String::new();
    let mut w4a16_grouped_inc = String::new();
    let in_names = abi_enum(&abi, "InKind");
    for (ci, c) in configs.iter().enumerate() {
        if !built(c) {
            continue;
        }
        let (_, _, gencode, header, _) = ARCHES.iter().find(|a| a.0 == c.arch).unwrap();
        let parts = &arch_sources.iter().find(|a| a.0 == c.arch).unwrap().1;
        let out_index = |o: &str| out_names.iter().position(|n| n == o).unwrap();
        let output = |o: &str, what: &str| outputs.iter().find(|x| x.name == o).unwrap_or_else(|| panic!("{what} output {o} has no BSG_OUTPUT line"));
        // One translation unit per config, holding every kernel of it: nvcc spends nearly all of a
        // unit's time on the headers (an SM90 unit of one kernel about 13 s, of five 19 s; an
        // SM100 unit of one 65 s, of twelve 92 s). Every object's key holds all of its
        // architecture's parts, so a change to any of them rebuilds every unit either way; a
        // change to one config's lines rebuilds that config's unit.
        let unit = format!("bsg_{}", c.name.to_lowercase());
        let mut src = format!("// Generated by build.rs from cpp/configs.def: {}, every kernel.\n#include \"{header}\"\n", c.name);
        let (tm, tn, schedule) = (c.tile[0], c.tile[1], &c.schedule);
        let args = |ty: &str| format!("{sms}, {tm}, {tn}, {tk}, {cm}, {cn}, {ty}", sms = c.sms, tk = c.tile[2], cm = c.cluster[0], cn = c.cluster[1]);
        // SM90's dense kernels also take the main-loop schedule.
        let schedule_arg = if c.arch == 90 { format!(", {schedule}") } else { String::new() };
        for o in outputs.iter().filter(|o| o.applies_to(c)) {
            let func = format!("bsg_entry_{}_{}", c.name.to_lowercase(), o.name.to_lowercase());
            writeln!(src, "BSG_SM{arch}_KERNEL({func}, {}{schedule_arg})", args(&o.cutlass_type), arch = c.arch).unwrap();
            writeln!(table_inc, "BSG_KERNEL({ci}, {}, {func})", out_index(&o.name)).unwrap();
        }
        if !c.grouped.is_empty() {
            writeln!(src, "#include \"sm{}/gemm_grouped.cuh\"", c.arch).unwrap();
        }
        if c.arch == 90 && !c.grouped_list.is_empty() {
            src += "#include \"sm90/gemm_grouped_list.cuh\"\n";
        }
        if let Some(o) = c.grouped_list.iter().find(|o| c.arch == 100 && !c.grouped.contains(o)) {
            panic!("cpp/configs.def: {} has a BSG_GROUPED_LIST {o} output but no BSG_GROUPED one (SM100 builds the list form with it)", c.name);
        }
        for o in &c.grouped {
            let ty = &output(o, "BSG_GROUPED").cutlass_type;
            let func = format!("bsg_grouped_{}_{}", c.name.to_lowercase(), o.to_lowercase());
            if c.arch == 90 {
                writeln!(src, "BSG_SM90_GROUPED_KERNEL({func}, {tm}, {tn}, {ty}, {schedule})").unwrap();
            } else {
                writeln!(src, "BSG_SM100_GROUPED_KERNEL({func}, {})", args(ty)).unwrap();
            }
            writeln!(grouped_inc, "BSG_GROUPED_KERNEL({ci}, {}, {func})", out_index(o)).unwrap();
        }
        for o in &c.grouped_list {
            let ty = &output(o, "BSG_GROUPED_LIST").cutlass_type;
            let func = format!("bsg_grouped_list_{}_{}", c.name.to_lowercase(), o.to_lowercase());
            if c.arch == 90 {
                writeln!(src, "BSG_SM90_GROUPED_LIST_KERNEL({func}, {tm}, {tn}, {ty}, {schedule})").unwrap();
            } else {
                writeln!(src, "BSG_SM100_GROUPED_LIST_KERNEL({func}, {})", args(ty)).unwrap();
            }
            writeln!(grouped_list_inc, "BSG_GROUPED_LIST_KERNEL({ci}, {}, {func})", out_index(o)).unwrap();
        }
        // Its W4A16 kernels (SM90), for each activation type, and their grouped form where the
        // config has grouped kernels for that output.
        for (input, in_type) in W4A16_INPUTS.iter().filter(|_| !c.w4a16.is_empty()) {
            let in_index = in_names.iter().position(|n| n == input).expect("kernel_abi.h's InKind names the W4A16 inputs");
            let stem = format!("bsg_w4a16_{}_{}", c.name.to_lowercase(), input.to_lowercase());
            for o in &c.w4a16 {
                let ty = &output(o, "BSG_W4A16").cutlass_type;
                let func = format!("{stem}_{}", o.to_lowercase());
                writeln!(src, "BSG_SM90_W4A16_KERNEL({func}, {tm}, {tn}, {ty}, {schedule}, {in_type})").unwrap();
                writeln!(w4a16_inc, "BSG_W4A16_KERNEL({ci}, {in_index}, {}, {func})", out_index(o)).unwrap();
                if c.grouped.contains(o) {
                    let gfunc = format!("{stem}_grouped_{}", o.to_lowercase());
                    writeln!(src, "BSG_SM90_GROUPED_W4A16_KERNEL({gfunc}, {tm}, {tn}, {ty}, {schedule}, {in_type})").unwrap();
                    writeln!(w4a16_grouped_inc, "BSG_W4A16_GROUPED_KERNEL({ci}, {in_index}, {}, {gfunc})", out_index(o)).unwrap();
                }
            }
        }
        // SM100's grouped kernels also include `cpp/common/` (the experts' rows).
        let parts = if c.arch == 100 && !c.grouped.is_empty() { &sm100_grouped_parts } else { parts };
        if src.lines().any(|l| l.starts_with("BSG_")) {
            jobs.push(kernel_job(&unit, &src, gencode, parts));
        }
    }
    let kernel_jobs = jobs.len();
    // The quantizer: one object with code for every built architecture (all of them in a build of
    // none, since the bridge always links it).
    {
        let gencodes: Vec<&str> = ARCHES.iter().filter(|a| archs.is_empty() || archs.contains(&a.0)).map(|a| a.2).collect();
        let mut flags = tools.nvcc_flags(&root, gencodes[0]);
        flags.extend(gencodes[1..].iter().map(|g| format!("-gencode={g}")));
        let mut h = Sha256::new();
        for d in ["quant", "common"] {
            hash_tree(&mut h, &root.join("cpp").join(d), &["cu", "cuh", "h"]);
        }
        let obj = cache.join(format!("quantize-{}.o", &object_key(&common, &[&h.finalize()], &flags)[..24]));
        jobs.push((root.join("cpp/quant/quantize.cu"), obj, flags));
    }
    // Host helpers that need CUDA/CUTLASS headers: status names, CUTLASS's host reference.
    for name in HOST_SOURCES {
        let flags = tools.nvcc_flags(&root, ARCHES[0].2);
        let src = std::fs::read(root.join("cpp").join(name)).unwrap();
        let stem = name.trim_start_matches("host/").trim_end_matches(".cu");
        let obj = cache.join(format!("{stem}-{}.o", &object_key(&common, &[&src], &flags)[..24]));
        jobs.push((root.join("cpp").join(name), obj, flags));
    }
    std::fs::write(gen_dir.join("kernel_table.inc"), &table_inc).unwrap();
    std::fs::write(gen_dir.join("grouped_table.inc"), &grouped_inc).unwrap();
    std::fs::write(gen_dir.join("grouped_list_table.inc"), &grouped_list_inc).unwrap();
    std::fs::write(gen_dir.join("w4a16_table.inc"), &w4a16_inc).unwrap();
    std::fs::write(gen_dir.join("w4a16_grouped_table.inc"), &w4a16_grouped_inc).unwrap();

    let compiled = compile_all(&tools, &jobs);
    let objects: Vec<&PathBuf> = jobs.iter().map(|j| &j.1).collect();
    let stale = cache::remove_temporaries(&cache, cache::is_nvcc_temporary, std::time::SystemTime::now());
    let log = format!("nvcc: {} objects, {} compiled, {} from cache {}; {stale} temporaries of killed builds removed from it\n", jobs.len(), compiled, jobs.len() - compiled, cache.display());
    std::fs::write(out_dir.join("nvcc-log.txt"), &log).unwrap();
    if compiled > 0 {
        println!("cargo:warning=blockscaled-gemm: {}", log.trim());
    }

    cxx_build::bridge("src/sys/bridge.rs")
        .file("cpp/host/bridge.cpp")
        .include(root.join("include"))
        .include(&gen_dir)
        .objects(&objects)
        .std("c++17")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("blockscaled_gemm_shim");

    println!("cargo:rustc-link-search=native={}", tools.cudart_lib_dir.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    for lib in ["dl", "rt", "pthread"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    // For the SASS tests and the GPU bundle: where the tools and kernel objects are.
    println!("cargo:rustc-env=BSG_CUOBJDUMP={}", tools.cuobjdump.display());
    println!("cargo:rustc-env=BSG_NVCC={}", tools.nvcc.display());
    let kernel_objs: Vec<String> = jobs[..kernel_jobs].iter().map(|j| j.1.display().to_string()).collect();
    println!("cargo:rustc-env=BSG_KERNEL_OBJECTS={}", kernel_objs.join(";"));
    let built: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
    println!("cargo:rustc-env=BSG_BUILT_ARCHS={}", built.join(","));
}

/// The Rust side of `include/blockscaled_gemm/kernel_abi.h`, generated by bindgen at every build,
/// so the launch arguments, status, kinds and limits have one declaration. libclang comes from
/// `LIBCLANG_PATH` if set, else from the pinned PyPI wheel `third_party/fetch.py` unpacks beside
/// nvcc (`wheel_libclang`), else from the system (clang-sys's search; docs.rs has clang).
fn generate_abi(root: &Path, wheel_libclang: Option<&Path>, out_dir: &Path) {
    if env("LIBCLANG_PATH").is_none() {
        if let Some(dir) = wheel_libclang {
            // SAFETY (of the process environment): build scripts run single-threaded here.
            std::env::set_var("LIBCLANG_PATH", dir);
        }
    }
    let header = root.join("include/blockscaled_gemm/kernel_abi.h");
    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .clang_args(["-x", "c++", "-std=c++17", "-DBSG_ABI_BINDGEN"])
        .enable_cxx_namespaces()
        .allowlist_type("bsg::KernelArgs")
        .allowlist_type("bsg::KernelStatus")
        .allowlist_type("bsg::OutKind")
        .allowlist_type("bsg::SfOperand")
        .allowlist_type("bsg::QuantizeArgs")
        .allowlist_type("bsg::GroupedArgs")
        .allowlist_type("bsg::GroupedListArgs")
        .allowlist_type("bsg::InKind")
        .allowlist_var("BSG_.*")
        .rustified_enum("bsg::.*")
        .derive_default(true)
        .derive_eq(true)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen on {}: {e} (set LIBCLANG_PATH to a folder holding libclang.so)", header.display()));
    bindings.write_to_file(out_dir.join("kernel_abi.rs")).expect("write kernel_abi.rs");
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Parses `BSG_CONFIG(...)`, `BSG_OUTPUT(...)` and `BSG_SM90_SCHEDULE(...)` lines; anything else
/// is ignored.
fn parse_table(text: &str, out_names: &[String]) -> (Vec<Config>, Vec<Output>) {
    let mut configs = Vec::new();
    let mut outputs = Vec::new();
    let mut schedules: Vec<(String, Vec<String>)> = Vec::new();
    let mut grouped: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut w4a16: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    let mut grouped_list: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for line in text.lines().map(str::trim) {
        let args = |prefix: &str| -> Option<Vec<String>> {
            let rest = line.strip_prefix(prefix)?.strip_suffix(')')?;
            Some(rest.split(',').map(|s| s.trim().to_string()).collect())
        };
        if let Some(a) = args("BSG_CONFIG(") {
            if a[0] == "name" {
                continue; // the #define line
            }
            assert_eq!(a.len(), 8, "configs.def: BSG_CONFIG needs 8 fields: {line}");
            let n = |i: usize| a[i].parse::<u32>().unwrap_or_else(|_| panic!("configs.def: field {i} of {line}"));
            let c = Config { name: a[0].clone(), arch: n(1), sms: n(2), tile: [n(3), n(4), n(5)], cluster: [n(6), n(7)], schedule: SCHEDULES[0].0.to_string(), grouped: Vec::new(), grouped_list: Vec::new(), w4a16: Vec::new() };
            assert!(ARCHES.iter().any(|x| x.0 == c.arch), "configs.def: unknown arch {}", c.arch);
            assert!(configs.iter().all(|o: &Config| o.name != c.name), "configs.def: duplicate {}", c.name);
            configs.push(c);
        } else if let Some(a) = args("BSG_OUTPUT(") {
            if a[0] == "name" {
                continue;
            }
            assert_eq!(a.len(), 4, "configs.def: BSG_OUTPUT needs 4 fields: {line}");
            assert!(out_names.contains(&a[0]), "configs.def: output {} is not one of kernel_abi.h's OutKind {out_names:?}", a[0]);
            let arches = a[1].split('|').map(|s| s.trim().parse().expect("configs.def: output arches")).collect();
            let configs = (a[3] != "all").then(|| a[3].split('|').map(|s| s.trim().to_string()).collect());
            outputs.push(Output { name: a[0].clone(), arches, cutlass_type: a[2].clone(), configs });
        } else if let Some(a) = args("BSG_SM90_SCHEDULE(") {
            if a[0] == "tag" {
                continue;
            }
            assert!(a.len() == 2, "configs.def: BSG_SM90_SCHEDULE(tag, `|` list): {line}");
            assert!(SCHEDULES.iter().any(|s| s.0 == a[0]), "configs.def: unknown schedule {}", a[0]);
            schedules.push((a[0].clone(), a[1].split('|').map(|s| s.trim().to_string()).collect()));
        } else if let Some(a) = args("BSG_GROUPED(") {
            if a[0] == "outputs" {
                continue;
            }
            assert!(a.len() == 2, "configs.def: BSG_GROUPED(`|` outputs, `|` configs): {line}");
            let list = |x: &str| x.split('|').map(|s| s.trim().to_string()).collect::<Vec<_>>();
            grouped.push((list(&a[0]), list(&a[1])));
        } else if let Some(a) = args("BSG_GROUPED_LIST(") {
            if a[0] == "outputs" {
                continue;
            }
            assert!(a.len() == 2, "configs.def: BSG_GROUPED_LIST(`|` outputs, `|` configs): {line}");
            let list = |x: &str| x.split('|').map(|s| s.trim().to_string()).collect::<Vec<_>>();
            grouped_list.push((list(&a[0]), list(&a[1])));
        } else if let Some(a) = args("BSG_W4A16(") {
            if a[0] == "outputs" {
                continue;
            }
            assert!(a.len() == 2, "configs.def: BSG_W4A16(`|` outputs, `|` configs): {line}");
            let list = |x: &str| x.split('|').map(|s| s.trim().to_string()).collect::<Vec<_>>();
            w4a16.push((list(&a[0]), list(&a[1])));
        }
    }
    assert!(!configs.is_empty(), "configs.def: no BSG_CONFIG lines");
    for (tag, names) in &schedules {
        for name in names {
            let c = configs.iter_mut().find(|c| &c.name == name).unwrap_or_else(|| panic!("configs.def: BSG_SM90_SCHEDULE names unknown config {name}"));
            assert_eq!(c.arch, 90, "configs.def: BSG_SM90_SCHEDULE lists {name}, not an SM90 config");
            assert_eq!(c.schedule, SCHEDULES[0].0, "configs.def: {name} is given two schedules");
            c.schedule = tag.clone();
        }
    }
    // BSG_GROUPED and BSG_W4A16: outputs of extra kernels on SM90 stream or swapped configs, and
    // (BSG_GROUPED, BSG_GROUPED_LIST) on SM100 configs (their outputs but f32).
    // BSG_GROUPED_LIST: SM90 stream or swapped configs, every SM90 output.
    for (line, lists, field) in [("BSG_GROUPED", &grouped, 0), ("BSG_W4A16", &w4a16, 1), ("BSG_GROUPED_LIST", &grouped_list, 2)] {
        for (outs, names) in lists {
            for name in names {
                let c = configs.iter_mut().find(|c| &c.name == name).unwrap_or_else(|| panic!("configs.def: {line} names unknown config {name}"));
                let sm90 = c.arch == 90 && (c.schedule.starts_with("MainloopStream") || c.schedule == "MainloopSwappedRegisterDecode");
                assert!(sm90 || (c.arch == 100 && field != 1), "configs.def: {line} lists {name}, not an SM90 stream or swapped config{}", if field != 1 { " or an SM100 one" } else { "" });
                let list = match field {
                    0 => &mut c.grouped,
                    1 => &mut c.w4a16,
                    _ => &mut c.grouped_list,
                };
                for o in outs {
                    let allowed: &[&str] = match (c.arch, field) {
                        (100, _) => &["F16", "Bf16", "Nvfp4", "Nvfp4Ue8m0"],
                        (_, 0 | 2) => &["F16", "Bf16", "F32", "Nvfp4", "Nvfp4Ue8m0"],
                        _ => &["F16", "Bf16", "F32"],
                    };
                    assert!(allowed.contains(&o.as_str()), "configs.def: {line} output {o} of {name}: one of {allowed:?}");
                    assert!(!list.contains(o), "configs.def: {line} gives {name} output {o} twice");
                    list.push(o.clone());
                }
            }
        }
    }
    for o in &outputs {
        for name in o.configs.iter().flatten() {
            let c = configs.iter().find(|c| &c.name == name).unwrap_or_else(|| panic!("configs.def: output {} names unknown config {name}", o.name));
            assert!(o.arches.contains(&c.arch), "configs.def: output {} lists {name}, not of its arches", o.name);
        }
    }
    (configs, outputs)
}

/// The names of a launch-ABI enum `enum class NAME : int32_t { A = 0, B = 1, ... }`, in index
/// order: OutKind, the one list of output types (configs.def names them, Rust maps to them), and
/// InKind (the quantizer's inputs and the W4A16 activations).
fn abi_enum(abi: &str, name: &str) -> Vec<String> {
    let line = abi.lines().find(|l| l.trim_start().starts_with(&format!("enum class {name} "))).unwrap_or_else(|| panic!("kernel_abi.h: enum class {name}"));
    let body = &line[line.find('{').expect("enum {") + 1..line.rfind('}').expect("enum }")];
    let kinds: Vec<(String, usize)> = body.split(',').map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("kernel_abi.h: {name} values are explicit"));
        (k.trim().to_string(), v.trim().parse().unwrap_or_else(|_| panic!("kernel_abi.h: {name} value")))
    }).collect();
    assert!(kinds.iter().enumerate().all(|(i, k)| k.1 == i), "kernel_abi.h: {name} values must be 0, 1, 2, ...");
    kinds.into_iter().map(|k| k.0).collect()
}

/// The Rust side of the table: `Config` and its facts, generated so it cannot drift.
fn rust_table(configs: &[Config], outputs: &[Output], archs: &[u32], built: &dyn Fn(&Config) -> bool) -> String {
    let mut s = String::from("// Generated by build.rs from cpp/configs.def.\n\n");
    writeln!(s, "/// Architectures whose kernels this build holds (`BSG_ARCHS`).\nconst BUILT_ARCHS: &[u32] = &{archs:?};\n").unwrap();
    let names: Vec<&str> = configs.iter().filter(|c| built(c)).map(|c| c.name.as_str()).collect();
    writeln!(s, "/// Configs whose kernels this build holds (`BSG_ARCHS`, `BSG_CONFIGS`).\nconst BUILT_CONFIGS: &[&str] = &{names:?};\n").unwrap();
    s += "/// A kernel configuration from `cpp/configs.def` (tile M x N x K, SMs per MMA, cluster).\n";
    s += "#[allow(non_camel_case_types)]\n#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]\n#[non_exhaustive]\npub enum Config {\n";
    for c in configs {
        if c.arch == 90 {
            writeln!(s, "    /// SM90 (Hopper), tile {}x{}x{}, schedule `{}`.", c.tile[0], c.tile[1], c.tile[2], c.schedule).unwrap();
        } else {
            writeln!(s, "    /// SM{} {}-SM UMMA, tile {}x{}x{}, cluster {}x{}x1.", c.arch, c.sms, c.tile[0], c.tile[1], c.tile[2], c.cluster[0], c.cluster[1]).unwrap();
        }
        writeln!(s, "    {},", c.name).unwrap();
    }
    s += "}\n\nimpl Config {\n    /// Every configuration, in table order (the index is the C++ table index).\n    pub const ALL: &'static [Config] = &[";
    for c in configs {
        write!(s, "Config::{}, ", c.name).unwrap();
    }
    s += "];\n\n    /// The facts of this configuration.\n    pub const fn info(self) -> ConfigInfo {\n        match self {\n";
    for (i, c) in configs.iter().enumerate() {
        let outs: Vec<String> = outputs.iter().filter(|o| o.applies_to(c)).map(|o| format!("OutType::{}", o.name)).collect();
        let schedule = if c.arch == 90 { SCHEDULES.iter().find(|x| x.0 == c.schedule).unwrap().1 } else { "Cutlass" };
        let grouped: Vec<String> = c.grouped.iter().map(|o| format!("OutType::{o}")).collect();
        let w4a16: Vec<String> = c.w4a16.iter().map(|o| format!("OutType::{o}")).collect();
        let grouped_list: Vec<String> = c.grouped_list.iter().map(|o| format!("OutType::{o}")).collect();
        writeln!(s, "            Config::{n} => ConfigInfo {{ index: {i}, name: \"{n}\", arch: {a}, sms: {sms}, tile: [{}, {}, {}], cluster: [{}, {}], schedule: Schedule::{schedule}, outputs: &[{outs}], grouped: &[{grouped}], grouped_list: &[{grouped_list}], w4a16: &[{w4a16}] }},",
            c.tile[0], c.tile[1], c.tile[2], c.cluster[0], c.cluster[1], n = c.name, a = c.arch, sms = c.sms, outs = outs.join(", "), grouped = grouped.join(", "), grouped_list = grouped_list.join(", "), w4a16 = w4a16.join(", ")).unwrap();
    }
    s += "        }\n    }\n}\n";
    s
}

fn requested_archs(configs: &[Config]) -> Vec<u32> {
    let all: Vec<u32> = ARCHES.iter().map(|a| a.0).filter(|a| configs.iter().any(|c| c.arch == *a)).collect();
    let Some(list) = env("BSG_ARCHS") else { return all };
    let mut out = Vec::new();
    for item in list.split(',').map(|s| s.trim().to_lowercase()).filter(|s| !s.is_empty()) {
        let digits: String = item.chars().filter(|c| c.is_ascii_digit()).collect();
        let arch: u32 = digits.parse().unwrap_or_else(|_| panic!("BSG_ARCHS: cannot read {item:?}; use e.g. sm100"));
        assert!(all.contains(&arch), "BSG_ARCHS: {item} is not one of {:?}", ARCHES.iter().map(|a| a.1).collect::<Vec<_>>());
        out.push(arch);
    }
    out
}

fn cache_dir() -> PathBuf {
    if let Some(d) = env("BSG_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let base = env("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")));
    base.unwrap_or_else(|| PathBuf::from(env("OUT_DIR").unwrap())).join("blockscaled-gemm")
}

struct Toolchain {
    nvcc: PathBuf,
    cuobjdump: PathBuf,
    cuda_include: Option<PathBuf>,
    cudart_lib_dir: PathBuf,
    cutlass: PathBuf,
    nvcc_version: String,
    host_cxx_version: String,
    cutlass_identity: String,
    /// pins.txt where the pinned CUDA wheels compile; with the user's toolkit its ptxas version
    /// and a hash of its headers.
    wheel_pins: String,
    /// The pinned libclang wheel's library folder, when fetched.
    libclang_dir: Option<PathBuf>,
}

impl Toolchain {
    fn locate(root: &Path) -> Toolchain {
        let tp = toolchain_dir(root);
        let wheel_cuda = tp.join("cuda/nvidia/cu13");
        let user_cuda = toolkit::user_cuda(env("NVCC").as_deref(), env("CUDA_HOME").as_deref(), std::env::var_os("PATH").as_deref())
            .unwrap_or_else(|e| panic!("{e}"));
        if let Some((nvcc, _)) = &user_cuda {
            println!("cargo:rerun-if-changed={}", nvcc.display());
        }
        let user_cutlass = env("CUTLASS_DIR").map(PathBuf::from);
        // fetch.py renames the toolchain into place whole, so an existing folder is complete.
        if (user_cuda.is_none() || user_cutlass.is_none()) && !tp.is_dir() {
            fetch(root, &tp);
        }
        let now = std::time::SystemTime::now();
        for d in ["toolchain", "wheels"] {
            cache::remove_temporaries(&cache_dir().join(d), cache::is_fetch_temporary, now);
        }
        let pins = std::fs::read_to_string(root.join("third_party/pins.txt")).unwrap();
        // A user toolkit that is the pinned one's own folder (CUDA_HOME set to it) builds the
        // same objects: it takes the pinned key, not a second copy of every object.
        let pinned_cuda = user_cuda.as_ref().is_none_or(|(nvcc, _)| toolkit::same_place(nvcc, &wheel_cuda.join("bin/nvcc")));
        let from = if user_cuda.is_some() { "CUDA_HOME/NVCC" } else { "the pinned wheels" };
        let (nvcc, cuda_root) = user_cuda.unwrap_or((wheel_cuda.join("bin/nvcc"), wheel_cuda.clone()));
        let cudart_lib_dir = ["lib64", "lib", "lib/x64"].iter().map(|d| cuda_root.join(d)).find(|d| d.join("libcudart_static.a").exists())
            .unwrap_or_else(|| panic!("no lib64/libcudart_static.a under {} (from {from}): not a CUDA 13 toolkit root", cuda_root.display()));
        // cuobjdump: the toolkit's own, else the pinned wheel's.
        let cuobjdump = [cuda_root.join("bin/cuobjdump"), wheel_cuda.join("bin/cuobjdump")].into_iter().find(|p| p.exists()).unwrap_or_default();
        let (cutlass, cutlass_identity) = match user_cutlass {
            // CUTLASS_DIR set to the pinned copy itself: the pinned key.
            Some(dir) if !toolkit::same_place(&dir, &tp.join("cutlass")) => {
                let mut h = Sha256::new();
                hash_tree(&mut h, &dir.join("include"), &[]);
                hash_tree(&mut h, &dir.join("tools/util/include"), &[]);
                (dir, hex(&h.finalize()))
            }
            _ => {
                let pin = pins.lines().find(|l| l.starts_with("nvidia-cutlass ")).expect("pins.txt: nvidia-cutlass").to_string();
                (tp.join("cutlass"), pin)
            }
        };
        assert!(cutlass.join("include/cutlass/cutlass.h").exists(), "no CUTLASS headers at {}", cutlass.display());
        let nvcc_version = run_version(Command::new(&nvcc).arg("--version"), &nvcc.display().to_string());
        // Every pinned wheel (nvvm, crt, cccl and the runtime headers move apart from nvcc's own
        // version); for a user toolkit, which may be assembled from such wheels too, its ptxas
        // and its headers.
        let wheel_pins = if pinned_cuda {
            pins.clone()
        } else {
            let ptxas = Command::new(cuda_root.join("bin/ptxas")).arg("--version").output().map(|o| o.stdout).unwrap_or_default();
            let ptxas = String::from_utf8_lossy(&ptxas);
            let mut h = Sha256::new();
            hash_tree(&mut h, &cuda_root.join("include"), &[]);
            format!("user toolkit\0{ptxas}\0{}", hex(&h.finalize()))
        };
        let ccbin = env("NVCC_CCBIN").unwrap_or_else(|| "g++".into());
        let host_cxx_version = run_version(Command::new(&ccbin).arg("--version"), &ccbin);
        let include = cuda_root.join("include");
        let libclang = tp.join("libclang");
        let libclang_dir = libclang.join("libclang.so").exists().then_some(libclang);
        Toolchain { nvcc, cuobjdump, cuda_include: include.exists().then_some(include), cudart_lib_dir, cutlass, nvcc_version, host_cxx_version, cutlass_identity, wheel_pins, libclang_dir }
    }

    fn nvcc_flags(&self, root: &Path, gencode: &str) -> Vec<String> {
        let mut f: Vec<String> = [
            "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC",
            "-Xcompiler=-Wno-psabi",
        ].iter().map(|s| s.to_string()).collect();
        f.push(format!("-gencode={gencode}"));
        for inc in [root.join("cpp"), root.join("include"), self.cutlass.join("include"), self.cutlass.join("tools/util/include")] {
            f.push(format!("-I{}", inc.display()));
        }
        if let Some(i) = &self.cuda_include {
            f.push(format!("-I{}", i.display()));
        }
        if let Some(cc) = env("NVCC_CCBIN") {
            f.push(format!("-ccbin={cc}"));
        }
        if let Some(defs) = env("BSG_NVCC_DEFINES") {
            f.extend(defs.split_whitespace().map(|d| format!("-D{d}")));
        }
        f
    }
}

/// Where the pinned wheels unpack: `<cache>/toolchain/<hash of the pins and the fetch script>`,
/// never the crate's own folder (read-only when it comes from a registry).
fn toolchain_dir(root: &Path) -> PathBuf {
    let mut h = Sha256::new();
    for f in ["third_party/pins.txt", "third_party/fetch.py"] {
        h.update(std::fs::read(root.join(f)).unwrap_or_else(|e| panic!("read {f}: {e}")));
    }
    cache_dir().join("toolchain").join(&hex(&h.finalize())[..16])
}

fn fetch(root: &Path, dest: &Path) {
    let script = root.join("third_party/fetch.py");
    let status = Command::new("python3").arg(&script).arg(dest).status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("third_party/fetch.py failed ({s}); it needs pip and access to PyPI, or set CUDA_HOME and CUTLASS_DIR"),
        Err(_) => panic!("python3 not found: it fetches the pinned nvcc and CUTLASS wheels (or set CUDA_HOME and CUTLASS_DIR)"),
    }
}

fn run_version(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(out.status.success(), "{what} --version failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compiles the jobs whose object is not cached yet, in parallel; returns how many ran.
fn compile_all(tools: &Toolchain, jobs: &[(PathBuf, PathBuf, Vec<String>)]) -> usize {
    // An object is written under a temporary name and renamed whole; an empty one (a rename that
    // outran its data on a power loss) is compiled again rather than linked.
    let cached = |o: &Path| std::fs::metadata(o).is_ok_and(|m| m.len() > 0);
    let todo: Vec<&(PathBuf, PathBuf, Vec<String>)> = jobs.iter().filter(|j| !cached(&j.1)).collect();
    let threads = env("BSG_NVCC_JOBS").or_else(|| env("NUM_JOBS")).and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.min(todo.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((src, obj, flags)) = todo.get(i) else { break };
                let tmp = obj.with_extension(format!("tmp{}", std::process::id()));
                let t = std::time::Instant::now();
                let out = Command::new(&tools.nvcc).args(flags.iter()).arg("-c").arg(src).arg("-o").arg(&tmp).output();
                match out {
                    Ok(o) if o.status.success() => match serialized_wgmma(&o) {
                        Some(note) => {
                            let _ = std::fs::remove_file(&tmp);
                            errors.lock().unwrap().push(format!("{}: {note}", src.display()));
                        }
                        None => {
                            std::fs::rename(&tmp, obj).unwrap(); // atomic: concurrent builds never see half an object
                            eprintln!("nvcc {} ({:.0} s)", src.display(), t.elapsed().as_secs_f64());
                        }
                    },
                    Ok(o) => {
                        // A failed nvcc may leave part of its output: never leave it in the shared cache.
                        let _ = std::fs::remove_file(&tmp);
                        errors.lock().unwrap().push(format!("{}:\n{}", src.display(), String::from_utf8_lossy(&o.stderr)));
                    }
                    Err(e) => errors.lock().unwrap().push(format!("cannot run {}: {e}", tools.nvcc.display())),
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "nvcc failed:\n{}", errors.join("\n"));
    todo.len()
}

/// ptxas's note that it serialized a kernel's wgmma (C7520 and its kin, "wgmma.mma_async
/// instructions are serialized"): the kernel still computes the same result, but waits after
/// every HGMMA (bench/DESIGN.md §10), so the build refuses the object.
fn serialized_wgmma(o: &std::process::Output) -> Option<String> {
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    text.lines().find(|l| l.contains("wgmma.mma_async instructions are serialized")).map(|l| format!("ptxas serialized wgmma: {}", l.trim()))
}

/// Cache key of one object: the shared inputs, its own sources, its flags (paths left out).
fn object_key(common: &[u8], sources: &[&[u8]], flags: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(common);
    for s in sources {
        h.update(s);
    }
    h.update(key_flags(flags).as_bytes());
    hex(&h.finalize())
}

/// Flags as they enter a cache key: include directories by role, not by path, so a fresh clone
/// elsewhere hits the same objects (their contents are hashed separately).
fn key_flags(flags: &[String]) -> String {
    flags.iter().map(|f| if f.starts_with("-I") { "-I<dir>" } else { f.as_str() }).collect::<Vec<_>>().join("\0")
}

/// Hashes the files below `dir` with one of `exts` (all files when empty): sorted relative
/// paths and contents.
fn hash_tree(h: &mut Sha256, dir: &Path, exts: &[&str]) {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let ext_ok = exts.is_empty() || p.extension().is_some_and(|e| exts.iter().any(|x| e == *x));
            if p.is_dir() {
                stack.push(p)
            } else if ext_ok {
                files.push(p)
            }
        }
    }
    files.sort();
    for f in files {
        h.update(f.strip_prefix(dir).unwrap().to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).unwrap_or_default());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
