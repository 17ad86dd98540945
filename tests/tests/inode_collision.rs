//! A host unix socket on a filesystem whose inode numbers pass 2^32 (XFS
//! over a terabyte, CephFS, NFS): sock_diag, by which the supervisor tells
//! the sandbox's own sockets, reports 32 bits of a socket file's inode
//! number. The sandbox binds sockets in its workspace until one shares the
//! host socket's low 32 bits, then connects to the host socket: the connect
//! must be refused and the host service must see nothing (SPEC §4.6), as
//! root and as uid 65534. The filesystem is a sparse 1.1 TB XFS image on a
//! loop device, whose third allocation group starts past inode 2^32.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use airlock_tests::tiers::*;
use airlock_tests::*;

fn base() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/airlock-inode-collision"))
}

/// The mounted XFS image, unmounted and removed when dropped.
struct Xfs {
    mnt: PathBuf,
    img: PathBuf,
}

impl Xfs {
    /// `None` where this machine cannot make one (not root, no mkfs.xfs,
    /// no loop devices): `.ci/run` installs xfsprogs, and CI runs as root.
    fn mount(dir: &Path) -> Option<Xfs> {
        if !is_root() || !Path::new("/dev/loop-control").exists() {
            return None;
        }
        if Command::new("mkfs.xfs").arg("-V").output().is_err() {
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let img = dir.join("xfs.img");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let ok = |c: &mut Command| c.status().is_ok_and(|s| s.success());
        assert!(ok(Command::new("truncate").args(["-s", "1100G"]).arg(&img)));
        assert!(ok(Command::new("mkfs.xfs")
            .args(["-q", "-f", "-d", "agsize=513g", "-l", "size=64m"])
            .arg(&img)));
        assert!(
            ok(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&img)
                .arg(&mnt)),
            "mounting the XFS image"
        );
        std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o777)).unwrap();
        Some(Xfs { mnt, img })
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = std::fs::remove_file(&self.img);
    }
}

/// Binds listening sockets in a writable directory of the first allocation
/// group until one's inode number has the host socket's low 32 bits, then
/// connects to the host socket.
const COLLIDE: &str = r#"
import os, socket, sys, time
host, low = sys.argv[1], sys.argv[2]
open("started", "w").close()
while not os.path.exists("bound"):
    time.sleep(0.02)
want = os.stat(host).st_ino & 0xffffffff
keep = []
for i in range(20000):
    p = os.path.join(low, "s%d" % i)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(p)
    s.listen(1)
    if os.stat(p).st_ino == want:
        keep.append(s)
        print("collision", flush=True)
        break
    # The file keeps its inode; only the first and the match stay open.
    if i == 0:
        keep.append(s)
    else:
        s.close()
else:
    print("no collision", flush=True)
    print("want %d, made %d..%d" % (want, os.stat(os.path.join(low, "s0")).st_ino, os.stat(p).st_ino), flush=True)
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect(host)
    c.sendall(b"from-the-sandbox\n")
    print("connect: ok", flush=True)
except OSError as e:
    print("connect: " + (os.strerror(e.errno) if e.errno else str(e)), flush=True)
# The sandbox's own sockets still work.
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(os.path.join(low, "s0"))
print("own: ok", flush=True)
"#;

#[test]
fn a_host_socket_past_2_32_cannot_be_reached_by_its_low_bits() {
    let Some(xfs) = Xfs::mount(&base().join(format!("fs-{}", std::process::id()))) else {
        eprintln!("skipped: needs root, loop devices and mkfs.xfs");
        return;
    };
    // Directories until one lands in an allocation group past 2^32.
    let svc = (0..8)
        .map(|i| xfs.mnt.join(format!("svc{i}")))
        .find(|d| {
            std::fs::create_dir(d).unwrap();
            std::fs::metadata(d).unwrap().ino() > u64::from(u32::MAX)
        })
        .expect("a directory numbered past 2^32");
    std::fs::set_permissions(&svc, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = xfs.mnt.join("collide.py");
    let mut n = 0;
    std::fs::write(&script, COLLIDE).unwrap();
    for user in users() {
        let f = Fixture::new_in(&xfs.mnt);
        let sock = svc.join(format!("host-{user}.sock"));
        // A directory of the first allocation group, where the sandbox's
        // sockets get small numbers.
        let low = loop {
            n += 1;
            let d = xfs.mnt.join(format!("low{n}"));
            std::fs::create_dir(&d).unwrap();
            if std::fs::metadata(&d).unwrap().ino() < 1 << 31 {
                break d;
            }
        };
        std::fs::set_permissions(&low, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut cmd = command(
            &f,
            Tier::Full,
            user,
            &["--network", "none", "--write", low.to_str().unwrap()],
            &format!(
                "python3 {} {} {}",
                script.display(),
                sock.display(),
                low.display()
            ),
        );
        let child = spawn_piped(&mut cmd);
        wait_for_file(&f.ws.join("started"));
        // Host files until the host socket's number within its group is
        // past what the first group has used (both groups number their
        // inodes alike, from the start): the sandbox reaches it by making
        // files.
        let probe = low.join("probe");
        std::fs::write(&probe, "").unwrap();
        let frontier = std::fs::metadata(&probe).unwrap().ino();
        std::fs::remove_file(&probe).unwrap();
        for i in 0.. {
            let p = svc.join(format!("data-{user}-{i}"));
            std::fs::write(&p, "").unwrap();
            if std::fs::metadata(&p).unwrap().ino() & 0xffff_ffff > frontier + 200 {
                break;
            }
        }
        // Bound once the run has started: no start-up mask covers it.
        let host = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(std::fs::metadata(&sock).unwrap().ino() > u64::from(u32::MAX));
        std::fs::write(f.ws.join("bound"), "").unwrap();
        let out = output_of(child);
        let ctx = format!("as_user={user}\n{}", show(&out));
        assert!(has_line(&out, "collision"), "no collision made\n{ctx}");
        assert!(has_line(&out, "connect: Connection refused"), "{ctx}");
        assert!(has_line(&out, "own: ok"), "{ctx}");
        host.set_nonblocking(true).unwrap();
        assert!(host.accept().is_err(), "the host socket was reached\n{ctx}");
    }
}
