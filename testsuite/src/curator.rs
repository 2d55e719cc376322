//! The Java side of the ZooKeeper interoperability test and benchmark: a small
//! Curator program kept in `testsuite/java/`, compiled with `javac` against Debian's
//! jars (`libcurator-recipes-java`, which `scripts/test` installs). Missing tools are
//! errors, never a skip.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

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

/// The Java program's benchmark server (`serve`): Curator cycles in rounds on request
/// over stdin/stdout, so the Rust benches interleave them with their own.
pub struct BenchServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl BenchServer {
    /// Starts `threads` threads on one Curator client connected to `hosts`, each
    /// cycling its own `kind` (`mutex`: an `InterProcessMutex`; `semaphore-N`: one
    /// lease of an `InterProcessSemaphoreV2` of N) at `path-<i>`; returns once the
    /// server has warmed up.
    pub fn start(hosts: &str, path: &str, threads: usize, kind: &str) -> Result<Self, String> {
        let mut child = worker()?
            .args(["serve", hosts, path, &threads.to_string(), kind])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run java: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the Curator bench server has no stdin/stdout".to_owned());
        };
        let mut server = BenchServer {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        };
        let line = server.line()?;
        if line.trim() != "ready" {
            return Err(format!("the Curator bench server did not start: {line:?}"));
        }
        Ok(server)
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("reading the Curator bench server: {e}"))?;
        Ok(line)
    }

    /// One round of `secs`, blocking this thread while Java runs it (nothing else
    /// is measured meanwhile): the cycles done and the time they took.
    pub fn round(&mut self, secs: Duration) -> Result<(u64, Duration), String> {
        writeln!(self.stdin, "{}", secs.as_secs_f64())
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to the Curator bench server: {e}"))?;
        let line = self.line()?;
        let field = |key: &str| -> Result<f64, String> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key))
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("bad Curator answer {line:?}"))
        };
        Ok((
            field("cycles=")? as u64,
            Duration::from_secs_f64(field("seconds=")?),
        ))
    }
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
