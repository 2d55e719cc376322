//! The Java side of the ZooKeeper interoperability test and benchmark: a small
//! Curator program kept in `testsuite/java/`, compiled with `javac` against Debian's
//! jars (`libcurator-recipes-java`, which `scripts/test` installs). Missing tools are
//! errors, never a skip.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's jars the program needs (Curator 5, the ZooKeeper 3.8 client, Guava, SLF4J
/// with the no-op binding so the tests' output stays readable).
const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("java/CuratorWorker.java")
}

/// The jars' class path.
pub fn classpath() -> Result<String, String> {
    let mut parts = Vec::new();
    for jar in JARS {
        let path = Path::new("/usr/share/java").join(format!("{jar}.jar"));
        if !path.exists() {
            return Err(format!(
                "{} is missing: install Debian's libcurator-recipes-java and zookeeper (scripts/test does)",
                path.display()
            ));
        }
        parts.push(path.display().to_string());
    }
    Ok(parts.join(":"))
}

/// Compiles the program (once per source change) and returns the command that runs
/// it, to which the caller adds the program's arguments.
pub fn worker() -> Result<Command, String> {
    let jars = classpath()?;
    let src = source();
    let code = std::fs::read(&src).map_err(|e| format!("{}: {e}", src.display()))?;
    let stamp = code.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    });
    let out = std::env::temp_dir().join(format!("dlock-curator-{stamp:016x}"));
    if !out.join("CuratorWorker.class").exists() {
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let status = Command::new("javac")
            .args(["-nowarn", "-d"])
            .arg(&out)
            .args(["-cp", &jars])
            .arg(&src)
            .status()
            .map_err(|e| format!("cannot run javac ({e}); install a JDK (scripts/test installs default-jdk-headless)"))?;
        if !status.success() {
            return Err(format!("javac failed on {}", src.display()));
        }
    }
    let mut java = Command::new("java");
    java.args([
        "-Xmx256m",
        "-cp",
        &format!("{}:{jars}", out.display()),
        "CuratorWorker",
    ]);
    Ok(java)
}
