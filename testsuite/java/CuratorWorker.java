// A Java service taking the same locks as dlock through Apache Curator's recipes, for
// the interoperability test and the benchmark. Built by the tests with javac against
// Debian's jars (libcurator-recipes-java); nothing is downloaded.
//
//   counter  CONNECT LOCK_PATH COUNTER_FILE ITERATIONS mutex|rw|latch|semaphore-N
//       ITERATIONS times: take the lock (InterProcessMutex, the write side of
//       InterProcessReadWriteLock, or the leadership of a LeaderLatch), claim the marker file COUNTER_FILE.held with an
//       exclusive create (fails if another holder is inside), read the counter, sleep,
//       write counter + 1, remove the marker, release. With semaphore-N: take one
//       lease of an InterProcessSemaphoreV2 of N and claim one of the N slot files
//       COUNTER_FILE.slot<i> instead (an overlap when all N are taken: more than N
//       holders). Prints "ready" once connected and "curator acquired=N overlaps=M"
//       at the end.
//   upgrade-witness  CONNECT LOCK_PATH MARKER_FILE WRITER_WAIT_MS
//       Beside dlock's upgradeable read: queues a writer of InterProcessReadWriteLock
//       that gives up after WRITER_WAIT_MS, and once its node is there a reader
//       behind it. Prints "queued" once both nodes are there, "writer gave-up" (or
//       "writer acquired") when the writer's acquire returns, and "reader acquired
//       overlap=N" when the reader holds: N is 1 if MARKER_FILE (made by dlock while
//       it holds the write side) exists then, else 0.
//   latch-candidate  CONNECT LATCH_PATH SESSION_MS
//       Failover benchmark: one LeaderLatch participant on a client with a session
//       timeout of SESSION_MS. Prints "campaigning" once its node exists, "leading"
//       when it leads, then waits to be killed.
//   serve    CONNECT LOCK_PATH THREADS [mutex|semaphore-N]
//       Benchmark server: THREADS threads, each with its own InterProcessMutex
//       (LOCK_PATH-<i>) on the one client session, or with semaphore-N its own
//       InterProcessSemaphoreV2 of N leases (one lease per cycle). Warms up for a second, prints
//       "ready", then for each line SECONDS read from stdin runs uncontended acquire +
//       release cycles for that long and prints the total "cycles=N seconds=S"; exits
//       at end of input.
//       (The Rust bench interleaves these rounds with its own, so drift in the
//       machine's speed hits every implementation alike.)

import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessLock;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorWorker {
    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: counter CONNECT LOCK_PATH COUNTER_FILE ITERATIONS mutex|rw|latch|semaphore-N | serve CONNECT LOCK_PATH THREADS [mutex|semaphore-N]");
            System.exit(64);
        }
        int sessionMs = args[0].equals("latch-candidate") ? Integer.parseInt(args[3]) : 10000;
        CuratorFramework client = CuratorFrameworkFactory.newClient(args[1], sessionMs, 5000, new RetryNTimes(10, 100));
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            System.err.println("curator: cannot connect to " + args[1]);
            System.exit(69);
        }
        try {
            if (args[0].equals("counter")) {
                System.out.println("ready");
                System.out.flush();
                counter(client, args[2], Paths.get(args[3]), Integer.parseInt(args[4]), args[5]);
            } else if (args[0].equals("upgrade-witness")) {
                upgradeWitness(client, args[2], Paths.get(args[3]), Long.parseLong(args[4]));
            } else if (args[0].equals("latch-candidate")) {
                latchCandidate(client, args[2]);
            } else if (args[0].equals("serve")) {
                serve(client, args[2], Integer.parseInt(args[3]), args.length > 4 ? args[4] : "mutex");
            } else {
                System.err.println("unknown command " + args[0]);
                System.exit(64);
            }
        } finally {
            client.close();
        }
    }

    static void counter(CuratorFramework client, String path, Path counter, int iterations, String kind)
            throws Exception {
        if (kind.equals("latch")) {
            latchCounter(client, path, counter, iterations);
            return;
        }
        if (kind.startsWith("semaphore-")) {
            semaphoreCounter(client, path, counter, iterations, Integer.parseInt(kind.substring("semaphore-".length())));
            return;
        }
        InterProcessLock lock = kind.equals("rw")
                ? new InterProcessReadWriteLock(client, path).writeLock()
                : new InterProcessMutex(client, path);
        Path marker = Paths.get(counter.toString() + ".held");
        int acquired = 0;
        int overlaps = 0;
        for (int i = 0; i < iterations; i++) {
            if (!lock.acquire(60, TimeUnit.SECONDS)) {
                System.err.println("curator: no lock within 60 s");
                System.exit(75);
            }
            try {
                acquired++;
                overlaps += step(counter, marker);
            } finally {
                lock.release();
            }
        }
        System.out.println("curator acquired=" + acquired + " overlaps=" + overlaps);
    }

    /**
     * The counter step: claims the marker file exclusively (1 if someone else is
     * inside), reads the counter, pauses, writes it + 1, drops the marker.
     */
    static int step(Path counter, Path marker) throws Exception {
        boolean claimed = true;
        try {
            Files.createFile(marker);
        } catch (FileAlreadyExistsException e) {
            claimed = false;
        }
        long value = Long.parseLong(new String(Files.readAllBytes(counter), StandardCharsets.UTF_8).trim());
        Thread.sleep(1);
        Files.write(counter, Long.toString(value + 1).getBytes(StandardCharsets.UTF_8));
        if (claimed) {
            Files.delete(marker);
        }
        return claimed ? 0 : 1;
    }

    /** The slot step under one lease of an InterProcessSemaphoreV2 of `total`. */
    static void semaphoreCounter(CuratorFramework client, String path, Path counter, int iterations, int total)
            throws Exception {
        InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, total);
        int acquired = 0;
        int overlaps = 0;
        for (int i = 0; i < iterations; i++) {
            Lease lease = semaphore.acquire(60, TimeUnit.SECONDS);
            if (lease == null) {
                System.err.println("curator: no lease within 60 s");
                System.exit(75);
            }
            try {
                acquired++;
                overlaps += slotStep(counter, total);
            } finally {
                semaphore.returnLease(lease);
            }
        }
        System.out.println("curator acquired=" + acquired + " overlaps=" + overlaps);
    }

    /**
     * The semaphore's step: claims one of `total` slot files with an exclusive
     * create (1 if all are taken: more holders than permits), pauses, drops it.
     */
    static int slotStep(Path counter, int total) throws Exception {
        Path claimed = null;
        for (int s = 0; s < total && claimed == null; s++) {
            Path slot = Paths.get(counter.toString() + ".slot" + s);
            try {
                Files.createFile(slot);
                claimed = slot;
            } catch (FileAlreadyExistsException e) {
                // Taken: try the next.
            }
        }
        Thread.sleep(5);
        if (claimed == null) {
            return 1;
        }
        Files.delete(claimed);
        return 0;
    }

    /** How many of the lock's children carry `marker`. */
    static long nodes(CuratorFramework client, String path, String marker) throws Exception {
        return client.getChildren().forPath(path).stream().filter(c -> c.contains(marker)).count();
    }

    /** Waits (5 ms steps, at most 30 s) until `count` children carry `marker`. */
    static void awaitNodes(CuratorFramework client, String path, String marker, long count) throws Exception {
        long end = System.nanoTime() + 30_000_000_000L;
        while (nodes(client, path, marker) < count) {
            if (System.nanoTime() > end) {
                throw new IllegalStateException("no " + count + " " + marker + " nodes under " + path);
            }
            Thread.sleep(5);
        }
    }

    /** A writer that gives up, and a reader queued behind it (see the usage). */
    static void upgradeWitness(CuratorFramework client, String path, Path marker, long writerWaitMs)
            throws Exception {
        long readers = nodes(client, path, "__READ__");
        InterProcessReadWriteLock forWriter = new InterProcessReadWriteLock(client, path);
        InterProcessReadWriteLock forReader = new InterProcessReadWriteLock(client, path);
        Thread writer = new Thread(() -> {
            try {
                boolean got = forWriter.writeLock().acquire(writerWaitMs, TimeUnit.MILLISECONDS);
                if (got) {
                    forWriter.writeLock().release();
                }
                System.out.println(got ? "writer acquired" : "writer gave-up");
                System.out.flush();
            } catch (Exception e) {
                e.printStackTrace();
                System.exit(70);
            }
        });
        writer.start();
        awaitNodes(client, path, "__WRIT__", 1);
        Thread reader = new Thread(() -> {
            try {
                if (!forReader.readLock().acquire(60, TimeUnit.SECONDS)) {
                    System.err.println("curator: no read within 60 s");
                    System.exit(75);
                }
                int overlap = Files.exists(marker) ? 1 : 0;
                forReader.readLock().release();
                System.out.println("reader acquired overlap=" + overlap);
                System.out.flush();
            } catch (Exception e) {
                e.printStackTrace();
                System.exit(70);
            }
        });
        reader.start();
        awaitNodes(client, path, "__READ__", readers + 1);
        System.out.println("queued");
        System.out.flush();
        writer.join();
        reader.join();
    }

    /** One LeaderLatch participant that leads until the process is killed. */
    static void latchCandidate(CuratorFramework client, String path) throws Exception {
        String id = "java-" + ProcessHandle.current().pid();
        LeaderLatch latch = new LeaderLatch(client, path, id);
        latch.start();
        boolean queued = false;
        while (!queued) {
            try {
                queued = latch.getParticipants().stream().anyMatch(p -> p.getId().equals(id));
            } catch (Exception e) {
                // The latch's node is not there yet.
            }
            if (!queued) {
                Thread.sleep(5);
            }
        }
        System.out.println("campaigning");
        System.out.flush();
        latch.await();
        System.out.println("leading");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }

    /** The counter step under the leadership of a new LeaderLatch per term. */
    static void latchCounter(CuratorFramework client, String path, Path counter, int terms) throws Exception {
        Path marker = Paths.get(counter.toString() + ".held");
        int led = 0;
        int overlaps = 0;
        for (int i = 0; i < terms; i++) {
            LeaderLatch latch = new LeaderLatch(client, path, "java-" + i);
            latch.start();
            try {
                if (!latch.await(60, TimeUnit.SECONDS)) {
                    System.err.println("curator: not leading within 60 s");
                    System.exit(75);
                }
                led++;
                overlaps += step(counter, marker);
            } finally {
                latch.close();
            }
        }
        System.out.println("curator acquired=" + led + " overlaps=" + overlaps);
    }

    /** One acquire + release of a benchmark thread's own lock or semaphore. */
    interface Cycle {
        void run() throws Exception;
    }

    static void serve(CuratorFramework client, String path, int threads, String kind) throws Exception {
        Cycle[] cycles = new Cycle[threads];
        for (int i = 0; i < threads; i++) {
            String own = path + "-" + i;
            if (kind.startsWith("semaphore-")) {
                InterProcessSemaphoreV2 semaphore =
                        new InterProcessSemaphoreV2(client, own, Integer.parseInt(kind.substring("semaphore-".length())));
                cycles[i] = () -> semaphore.returnLease(semaphore.acquire());
            } else {
                InterProcessMutex lock = new InterProcessMutex(client, own);
                cycles[i] = () -> {
                    lock.acquire();
                    lock.release();
                };
            }
        }
        cycleAll(cycles, 1.0);
        System.out.println("ready");
        System.out.flush();
        java.io.BufferedReader in = new java.io.BufferedReader(new java.io.InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            long start = System.nanoTime();
            long total = cycleAll(cycles, Double.parseDouble(line.trim()));
            System.out.println("cycles=" + total + " seconds=" + (System.nanoTime() - start) / 1e9);
            System.out.flush();
        }
    }

    /** Every cycle run by its own thread for SECONDS; the total number of cycles. */
    static long cycleAll(Cycle[] cycles, double seconds) throws Exception {
        long end = System.nanoTime() + (long) (seconds * 1e9);
        java.util.concurrent.atomic.AtomicLong total = new java.util.concurrent.atomic.AtomicLong();
        java.util.concurrent.atomic.AtomicReference<Exception> failure = new java.util.concurrent.atomic.AtomicReference<>();
        Thread[] threads = new Thread[cycles.length];
        for (int i = 0; i < cycles.length; i++) {
            Cycle cycle = cycles[i];
            threads[i] = new Thread(() -> {
                long n = 0;
                try {
                    while (System.nanoTime() < end) {
                        cycle.run();
                        n++;
                    }
                } catch (Exception e) {
                    failure.set(e);
                }
                total.addAndGet(n);
            });
            threads[i].start();
        }
        for (Thread t : threads) {
            t.join();
        }
        if (failure.get() != null) {
            throw failure.get();
        }
        return total.get();
    }
}
