//! Beside Java's Curator: the two exclude each other, a Curator reader and an upgrade.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock_spi::LockName;
use dlock_zk::ZkBackend;
use testsuite::curator;

use super::fixtures::*;

/// A Java service using Curator's `InterProcessMutex` and two dlock clients increment
/// one non-atomic counter under the same ZooKeeper lock: no update is lost and no two
/// holders ever overlap. Then the same with Curator's read-write lock (writers) against
/// dlock's read-write lock configured with `exclusive=rw`, with Curator's
/// `LeaderLatch` against dlock's election (one leader among both), and with Curator's
/// `InterProcessSemaphoreV2` of 2 against dlock's semaphore of 2 (each holder claims
/// one of 2 slot files: never more than 2 holders among both). Last, Curator's
/// writers against dlock writers that downgrade to a read after each increment:
/// while the downgraded read lasts, the counter does not move and no writer is
/// inside (a Curator writer queued during the write must not get in at the
/// downgrade).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_java_curator_exclude_each_other() {
    let Some(url) = url_for("zk") else { return };
    const PERMITS: u32 = 2;
    for (recipe, query) in [
        ("mutex", ""),
        ("rw", "?exclusive=rw"),
        ("latch", ""),
        ("semaphore", ""),
        ("rw-downgrade", "?exclusive=rw"),
    ] {
        let dlock_url = format!("{url}{query}");
        let backend = ZkBackend::connect(&dlock_url).await.unwrap();
        let lock = name(&format!("curator-{recipe}"));
        let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("counter");
        std::fs::write(&counter, "0").unwrap();

        const JAVA_ITERATIONS: u64 = 150;
        const DLOCK_ITERATIONS: u64 = 100;
        let mut java = curator::worker().unwrap_or_else(|e| panic!("{e}"));
        let mut child = java
            .args(["counter", &hosts_of(&url), &path])
            .arg(&counter)
            .arg(JAVA_ITERATIONS.to_string())
            .arg(match recipe {
                "semaphore" => format!("semaphore-{PERMITS}"),
                "rw-downgrade" => "rw".to_owned(),
                _ => recipe.to_owned(),
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run java");
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let reader = std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut ready = Some(ready_tx);
            let mut last = String::new();
            for line in lines.by_ref() {
                let line = line.unwrap_or_default();
                if line == "ready" {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                } else {
                    last = line;
                }
            }
            last
        });
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .expect("the Java worker connected within 60 s")
            .expect("the Java worker started");

        let mut workers = Vec::new();
        for _ in 0..2 {
            let m = manager(&dlock_url).await;
            let (lock, counter) = (lock.clone(), counter.clone());
            workers.push(tokio::spawn(async move {
                let handle = m.read_write_lock(&lock);
                let mut overlaps = 0;
                for i in 0..DLOCK_ITERATIONS {
                    if recipe == "semaphore" {
                        // 1 and 2 permits by turns (2: the whole semaphore).
                        let n = 1 + u32::try_from(i % 2).unwrap();
                        let permit = m
                            .semaphore(&lock, PERMITS)
                            .try_acquire(n, Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("permits within 60 s");
                        overlaps += claim_slots(&counter, n, PERMITS);
                        permit.release().await.unwrap();
                        continue;
                    }
                    if recipe == "latch" {
                        let term = m
                            .election(&lock)
                            .try_campaign("dlock", Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("leading within 60 s");
                        overlaps += increment(&counter);
                        term.resign().await.unwrap();
                        continue;
                    }
                    if recipe == "rw-downgrade" {
                        let g = handle
                            .write()
                            .try_lock(Duration::from_secs(60))
                            .await
                            .unwrap()
                            .expect("lock within 60 s");
                        overlaps += increment(&counter);
                        let read = g.downgrade().await.unwrap();
                        overlaps += watch_still(&counter);
                        read.unlock().await.unwrap();
                        continue;
                    }
                    let g = if recipe == "rw" {
                        handle.write().try_lock(Duration::from_secs(60)).await
                    } else {
                        m.lock(&lock).try_lock(Duration::from_secs(60)).await
                    };
                    let g = g.unwrap().expect("lock within 60 s");
                    overlaps += increment(&counter);
                    g.unlock().await.unwrap();
                }
                m.close().await;
                overlaps
            }));
        }
        let mut overlaps = 0;
        for w in workers {
            overlaps += w.await.unwrap();
        }
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .unwrap();
        let summary = reader.join().unwrap();
        assert!(status.success(), "the Java worker failed: {summary}");
        assert_eq!(
            summary,
            format!("curator acquired={JAVA_ITERATIONS} overlaps=0"),
            "{recipe}"
        );
        let value: u64 = std::fs::read_to_string(&counter)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(overlaps, 0, "{recipe}: dlock saw too many holders inside");
        if recipe == "semaphore" {
            // Holders overlap by design: slots are the check, not the counter.
            eprintln!(
                "semaphore: {JAVA_ITERATIONS} (Curator) + {} (dlock) leases of {PERMITS}, never more than {PERMITS} holders",
                2 * DLOCK_ITERATIONS
            );
            drop(backend);
            continue;
        }
        assert_eq!(
            value,
            JAVA_ITERATIONS + 2 * DLOCK_ITERATIONS,
            "{recipe}: lost updates"
        );
        eprintln!(
            "{recipe}: counter {value} = {JAVA_ITERATIONS} (Curator) + {} (dlock), 0 overlaps",
            2 * DLOCK_ITERATIONS
        );
        drop(backend);
    }
}

/// An upgrade beside Curator's readers and writers (the lock-history checker's
/// overlap that once kept ZooKeeper from upgrading): dlock holds an upgradeable
/// read; a Curator writer queues behind it, with a wait that runs out, and a
/// Curator reader behind that writer. The upgrade holds at once (neither holds),
/// and when the writer gives up the reader must still stay out while the write
/// side is held: it finds dlock's marker file if it gets in. Released, the reader
/// gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_reader_whose_writer_leaves_stays_out_of_an_upgrade() {
    let Some(url) = url_for("zk") else { return };
    let url = format!("{url}?exclusive=rw");
    let m = manager(&url).await;
    let backend = ZkBackend::connect(&url).await.unwrap();
    let lock = name("curator-upgrade");
    let path = backend.lock_path(&LockName::new(lock.as_str()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("upgraded");
    let rw = m.read_write_lock(&lock);
    let mut up = rw.upgradeable_read().lock().await.unwrap();

    const WRITER_WAIT: Duration = Duration::from_secs(3);
    let mut java = curator::worker().unwrap_or_else(|e| panic!("{e}"));
    let mut child = java
        .args(["upgrade-witness", &hosts_of(&url), &path])
        .arg(&marker)
        .arg(WRITER_WAIT.as_millis().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run java");
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = lines_tx.send(line.unwrap_or_default());
        }
    });
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(60)).await,
        "queued"
    );

    // Neither queued Curator node holds: the upgrade is granted well before the
    // writer gives up.
    let asked = Instant::now();
    assert!(
        up.try_upgrade(WRITER_WAIT / 2).await.unwrap(),
        "the upgrade waited for the queued writer or its reader"
    );
    assert!(asked.elapsed() < WRITER_WAIT);
    std::fs::write(&marker, "held").unwrap();
    assert_eq!(
        next_line(&mut lines, WRITER_WAIT * 3).await,
        "writer gave-up"
    );
    // The reader behind the writer looks again as the writer's node goes (a watch
    // event, milliseconds): a second is far more than it needs to get in.
    let early = next_line(&mut lines, Duration::from_secs(1)).await;
    assert_eq!(early, "", "the Curator reader got in beside the upgrade");
    up.check()
        .expect("the upgraded hold stayed live throughout");
    std::fs::remove_file(&marker).unwrap();
    up.unlock().await.unwrap();
    assert_eq!(
        next_line(&mut lines, Duration::from_secs(30)).await,
        "reader acquired overlap=0"
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    m.close().await;
}
