//! Dependencies point one way (ARCHITECTURE.md, "Modules"): a module may use only the
//! modules in layers below its own. This test reads every `crate::<module>` path in
//! `src/` and fails on one that points up or sideways.

use std::collections::BTreeSet;
use std::path::Path;

/// Top to bottom. Modules in one layer do not use each other.
const LAYERS: &[&[&str]] = &[
    &["main"],
    &["http", "server"],
    &["engine"],
    &["spark"],
    &["catalog"],
    &["checkpoint", "sink", "source"],
    &["state"],
    &["format", "kafka"],
    &["sql"],
    &["auth", "clock", "config", "fsutil", "testing", "types"],
    &["error"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level module a file under `src/` belongs to.
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn imports_follow_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = BTreeSet::new();
    let mut seen_modules = BTreeSet::new();
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let module = module_of(rel);
        if module == "lib" {
            continue;
        }
        seen_modules.insert(module.clone());
        let from = layer(&module)
            .unwrap_or_else(|| panic!("module {module} is not in a layer: add it to LAYERS"));
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            // `main.rs` is a separate crate: it names the library `tidemark::`.
            for prefix in ["crate::", "tidemark::"] {
                for (i, _) in line.match_indices(prefix) {
                    let rest = &line[i + prefix.len()..];
                    let dep: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if dep.is_empty() || dep == module {
                        continue;
                    }
                    let Some(to) = layer(&dep) else { continue };
                    if to <= from {
                        violations.insert(format!(
                            "{}:{}: {module} uses {dep} ({})",
                            rel.display(),
                            n + 1,
                            if to == from {
                                "same layer"
                            } else {
                                "a layer above"
                            }
                        ));
                    }
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the dependency direction:\n{}",
        violations.into_iter().collect::<Vec<_>>().join("\n")
    );
    // The table lists every module there is.
    for l in LAYERS {
        for m in *l {
            assert!(
                seen_modules.contains(*m),
                "LAYERS names {m}, which is not in src/"
            );
        }
    }
}
