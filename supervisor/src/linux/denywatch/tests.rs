//! The watch against a real inotify, in temporary directories.

use super::*;

/// Adding a watch changes the process's working directory for a moment
/// (the helper is single-threaded): one test at a time.
static CWD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    CWD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory holding `a/b` and an old file `old`, the test
/// holding the working-directory lock.
fn setup() -> (std::sync::MutexGuard<'static, ()>, tempfile::TempDir) {
    let one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("a/b")).unwrap();
    std::fs::write(t.path().join("old"), "x").unwrap();
    (one, t)
}

fn watch(d: &Path) -> DenyWatch {
    watch_in(&[d.join("a/b/key")], &[])
}

fn watch_in(names: &[PathBuf], write: &[PathBuf]) -> DenyWatch {
    let mut w = DenyWatch::new(instances().unwrap(), names, &[], write, &[])
        .unwrap()
        .unwrap();
    w.armed(None);
    // File times come from the coarse clock, a tick behind `armed`'s.
    std::thread::sleep(std::time::Duration::from_millis(50));
    w
}

#[test]
fn a_fresh_file_passes_and_an_old_one_or_a_link_stops() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::write(d.join("old"), "x").unwrap();
    let mut w = watch(d);
    std::fs::create_dir_all(d.join("a/b")).unwrap();
    std::fs::write(d.join("a/b/key.new"), "x").unwrap();
    std::fs::rename(d.join("a/b/key.new"), d.join("a/b/key")).unwrap();
    assert_eq!(w.check(), None);
    std::fs::hard_link(d.join("old"), d.join("a/b/key2")).unwrap();
    std::fs::rename(d.join("a/b/key2"), d.join("a/b/key")).unwrap();
    assert_eq!(w.check().map(|a| a.why), Some("existing-file"));
    let mut w = watch(d);
    std::os::unix::fs::symlink("b", d.join("a/l")).unwrap();
    std::fs::remove_dir_all(d.join("a/b")).unwrap();
    std::fs::rename(d.join("a/l"), d.join("a/b")).unwrap();
    assert_eq!(w.check().map(|a| a.why), Some("link"));
}

#[test]
fn a_fresh_denied_directory_is_watched_at_any_depth() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::write(d.join("old"), "x").unwrap();
    let mut w = DenyWatch::new(instances().unwrap(), &[d.join("deny")], &[], &[], &[])
        .unwrap()
        .unwrap();
    w.armed(None);
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::create_dir_all(d.join("deny/a")).unwrap();
    std::fs::write(d.join("deny/a/new"), "x").unwrap();
    assert_eq!(w.check(), None);
    std::fs::create_dir_all(d.join("deny/a/b")).unwrap();
    assert_eq!(w.check(), None);
    std::fs::hard_link(d.join("old"), d.join("deny/a/b/key")).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("existing-file", d.join("deny/a/b/key")));
}

/// Fill the queue of every watch on `dir` until the kernel drops events.
fn overflow(dir: &Path) {
    let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384);
    for i in 0..=max {
        let f = dir.join(format!("junk{i}"));
        std::fs::write(&f, "").unwrap();
        std::fs::remove_file(&f).unwrap();
    }
}

#[test]
fn lost_events_on_the_hosts_side_stop_the_run() {
    let (_one, t) = setup();
    let d = t.path();
    let mut w = watch(d);
    overflow(&d.join("a/b"));
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("unknown", PathBuf::from("(events lost)")));
}

#[test]
fn lost_events_in_a_writable_root_are_looked_at_again_and_only_a_change_stops() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let w_root = d.join("w");
    std::fs::create_dir_all(w_root.join("a/b")).unwrap();
    std::fs::create_dir_all(w_root.join("olddir")).unwrap();
    std::fs::write(w_root.join("a/b/key"), "x").unwrap();
    std::fs::write(d.join("old"), "x").unwrap();
    let key = w_root.join("a/b/key");
    let mut w = watch_in(std::slice::from_ref(&key), std::slice::from_ref(&w_root));
    // The host writes to the denied file and in a directory on the way
    // (times move, inodes do not), and events are lost: the run goes on.
    std::fs::write(&key, "more").unwrap();
    std::fs::write(w_root.join("a/other"), "x").unwrap();
    overflow(&w_root.join("a/b"));
    assert_eq!(w.check(), None);
    // A fresh file renamed over the denied name is no grant.
    overflow(&w_root.join("a/b"));
    std::fs::write(w_root.join("a/b/key.new"), "x").unwrap();
    std::fs::rename(w_root.join("a/b/key.new"), &key).unwrap();
    assert_eq!(w.check(), None);
    // An old inode renamed over it while the events were lost.
    overflow(&w_root.join("a/b"));
    std::fs::hard_link(d.join("old"), w_root.join("a/b/key2")).unwrap();
    std::fs::rename(w_root.join("a/b/key2"), &key).unwrap();
    assert_eq!(w.check().map(|a| a.why), Some("existing-file"));

    // A watched directory on the way replaced by an older one.
    let mut w = watch_in(std::slice::from_ref(&key), std::slice::from_ref(&w_root));
    overflow(&w_root.join("a/b"));
    std::fs::rename(w_root.join("a"), w_root.join("a-gone")).unwrap();
    std::fs::rename(w_root.join("olddir"), w_root.join("a")).unwrap();
    assert_eq!(w.check().map(|a| a.why), Some("existing-dir"));
}

/// The sandbox can flood a directory in its writable roots; the host's
/// side has a queue of its own, and is read first.
#[test]
fn a_flood_in_a_writable_root_hides_nothing_on_the_hosts_side() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    std::fs::create_dir_all(d.join("w")).unwrap();
    std::fs::create_dir_all(d.join("h")).unwrap();
    std::fs::write(d.join("old"), "x").unwrap();
    let names = [d.join("w/.env"), d.join("h/key")];
    let mut w = watch_in(&names, &[d.join("w")]);
    overflow(&d.join("w"));
    assert_eq!(w.check(), None);
    overflow(&d.join("w"));
    std::fs::hard_link(d.join("old"), d.join("h/key")).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("existing-file", d.join("h/key")));
    // Through `wait`, which reads one batch of the flooded side a time.
    std::fs::remove_file(d.join("h/key")).unwrap();
    let mut w = watch_in(&names, &[d.join("w")]);
    overflow(&d.join("w"));
    std::fs::hard_link(d.join("old"), d.join("h/key")).unwrap();
    let mut armed = None;
    let a = w
        .wait(&mut armed, None, nix::poll::PollTimeout::ZERO)
        .unwrap()
        .unwrap();
    assert_eq!((a.why, a.path), ("existing-file", d.join("h/key")));
}

/// What an event reported, replaced or removed before we read it: never
/// seen, so the run stops; a fresh file seen in time stops nothing.
#[test]
fn a_change_replaced_or_undone_before_we_look_stops_the_run() {
    let (_one, t) = setup();
    let d = t.path();
    let key = d.join("a/b/key");
    let fresh = |n: &str| {
        std::fs::write(d.join(n), "x").unwrap();
        std::fs::rename(d.join(n), &key).unwrap();
    };
    // Fresh files renamed over the name, each seen in time: nothing.
    let mut w = watch(d);
    fresh("f1");
    assert_eq!(w.check(), None);
    fresh("f2");
    assert_eq!(w.check(), None);
    // An old inode moved in and away again before we read the event.
    std::fs::hard_link(d.join("old"), d.join("a/b/key.old")).unwrap();
    std::fs::rename(d.join("a/b/key.old"), &key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("unseen", key.clone()));
    // An old inode moved in, then a fresh file renamed over it.
    let mut w = watch(d);
    std::fs::hard_link(d.join("old"), d.join("a/b/key.old")).unwrap();
    std::fs::rename(d.join("a/b/key.old"), &key).unwrap();
    fresh("f3");
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("unseen", key.clone()));
}

/// The kernel merges two identical events in a row: a hard link removed
/// and a fresh file made in its place would read as one create. With
/// removals in the queue the link's appearance is seen to be replaced.
#[test]
fn a_link_removed_and_replaced_before_we_look_is_not_merged_away() {
    let (_one, t) = setup();
    let d = t.path();
    let key = d.join("a/b/key");
    let mut w = watch(d);
    std::fs::hard_link(d.join("old"), &key).unwrap();
    std::fs::remove_file(&key).unwrap();
    std::fs::write(&key, "fresh").unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("unseen", key.clone()));
}

/// The host rewriting a denied file by removing and making it again may
/// get the same inode number back: each change read in time stops nothing.
#[test]
fn a_file_removed_and_made_again_in_time_stops_nothing() {
    let (_one, t) = setup();
    let d = t.path();
    let key = d.join("a/b/key");
    let mut w = watch(d);
    for _ in 0..3 {
        std::fs::write(&key, "v1").unwrap();
        assert_eq!(w.check(), None);
        std::fs::remove_file(&key).unwrap();
        assert_eq!(w.check(), None);
    }
    std::fs::write(&key, "v2").unwrap();
    assert_eq!(w.check(), None);
}

/// Lock files come and go in a denied directory the host makes during the
/// run (a first `kubectl` or `gpg`): only what is there is looked at.
#[test]
fn lock_files_in_a_fresh_denied_directory_stop_nothing() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let mut w = DenyWatch::new(instances().unwrap(), &[d.join("deny")], &[], &[], &[])
        .unwrap()
        .unwrap();
    w.armed(None);
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::create_dir(d.join("deny")).unwrap();
    assert_eq!(w.check(), None);
    for _ in 0..3 {
        std::fs::write(d.join("deny/config.lock"), "").unwrap();
        std::fs::write(d.join("deny/config.new"), "c").unwrap();
        std::fs::rename(d.join("deny/config.new"), d.join("deny/config")).unwrap();
        std::fs::remove_file(d.join("deny/config.lock")).unwrap();
    }
    assert_eq!(w.check(), None);
}

/// A link in the middle of the chain a denied name resolves through (a
/// profile switcher's `current`) is watched too: re-pointed, it changes
/// what the denied name leads to.
#[test]
fn a_link_in_the_middle_of_the_chain_is_watched() {
    let _one = one_at_a_time();
    let t = tempfile::tempdir().unwrap();
    let d = &t.path().canonicalize().unwrap();
    std::fs::create_dir_all(d.join(".profiles/work/aws")).unwrap();
    std::fs::create_dir_all(d.join(".profiles/personal/aws")).unwrap();
    std::os::unix::fs::symlink(".profiles/current/aws", d.join(".aws")).unwrap();
    std::os::unix::fs::symlink("work", d.join(".profiles/current")).unwrap();
    assert_eq!(
        links_on_the_way(&d.join(".aws/credentials")),
        vec![d.join(".aws"), d.join(".profiles/current")]
    );
    assert_eq!(
        links_on_the_way(&d.join(".profiles/work/aws")),
        Vec::<PathBuf>::new()
    );
    let mut w = DenyWatch::new(instances().unwrap(), &[d.join(".aws")], &[], &[], &[])
        .unwrap()
        .unwrap();
    w.armed(None);
    std::os::unix::fs::symlink("personal", d.join(".profiles/next")).unwrap();
    std::fs::rename(d.join(".profiles/next"), d.join(".profiles/current")).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("link", d.join(".aws")));
}

/// A directory a link's target enters and leaves with `..` decides where
/// the denied name leads, and so does a link on the way that lies in a
/// writable root: both are judged as the host's.
#[test]
fn a_dotdot_directory_and_a_link_in_a_writable_root_on_the_way_are_watched() {
    let (_one, t) = setup();
    let d = &t.path().canonicalize().unwrap();
    std::fs::create_dir_all(d.join("mid")).unwrap();
    std::fs::create_dir_all(d.join(".profiles/work/aws")).unwrap();
    std::fs::create_dir_all(d.join("alt/sub")).unwrap();
    std::os::unix::fs::symlink("mid/../.profiles/work/aws", d.join(".aws")).unwrap();
    assert_eq!(
        links_on_the_way(&d.join(".aws")),
        vec![d.join(".aws"), d.join("mid")]
    );
    let mut w = DenyWatch::new(instances().unwrap(), &[d.join(".aws")], &[], &[], &[])
        .unwrap()
        .unwrap();
    w.armed(None);
    std::fs::rename(d.join("mid"), d.join("mid.old")).unwrap();
    std::os::unix::fs::symlink("alt/sub", d.join("mid")).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("link", d.join(".aws")));

    // `~/.aws -> ws/cfg/aws`, `ws/cfg -> .profiles/work`, ws writable: the
    // link in the workspace is on the host's side, removals and all.
    let ws = d.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::remove_file(d.join(".aws")).unwrap();
    std::os::unix::fs::symlink("ws/cfg/aws", d.join(".aws")).unwrap();
    std::os::unix::fs::symlink(d.join(".profiles/work"), ws.join("cfg")).unwrap();
    let mut w = DenyWatch::new(
        instances().unwrap(),
        &[d.join(".aws")],
        &[],
        std::slice::from_ref(&ws),
        &[],
    )
    .unwrap()
    .unwrap();
    w.armed(None);
    std::fs::remove_file(ws.join("cfg")).unwrap();
    std::os::unix::fs::symlink(d.join(".profiles"), ws.join("cfg")).unwrap();
    std::fs::remove_file(ws.join("cfg")).unwrap();
    std::fs::create_dir(ws.join("cfg")).unwrap();
    let a = w.check().unwrap();
    assert_eq!((a.why, a.path), ("unseen", d.join(".aws")));
}
