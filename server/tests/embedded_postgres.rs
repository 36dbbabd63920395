//! The server binary on its embedded default: it starts its own Postgres, stops it on Ctrl-C,
//! reuses the data on the next start, and takes over a cluster left behind by a killed run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(data_dir: &Path) -> Server {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_server"))
            .env_remove("DATABASE_URL")
            .env("SLUICE_DATA_DIR", data_dir)
            .env("SLUICE_BIND", format!("127.0.0.1:{port}"))
            .env("SLUICE_WORKERS", "2")
            .spawn()
            .expect("start the server");
        Server { child, port }
    }

    fn get(&self, path: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    fn post(&self, path: &str, form: &str) -> Option<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        )
        .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        Some(answer)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.get("/healthz").is_some_and(|a| a.starts_with("HTTP/1.0 200") && a.contains("\"database\":\"ok\""))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server did not become healthy");
    }

    fn interrupt_and_wait(mut self) -> std::process::ExitStatus {
        Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().unwrap();
        self.child.wait().unwrap()
    }
}

/// A failing assertion must not leave the server (and its Postgres) running.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
            let _ = self.child.wait();
        }
    }
}

/// Postgres processes whose command line names this data folder.
fn postgres_processes(data_dir: &Path) -> usize {
    let needle = data_dir.join("postgres").canonicalize().unwrap_or(data_dir.join("postgres"));
    let needle = needle.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|cmd| cmd.contains("postgres") && cmd.contains(&needle))
        .count()
}

fn temp_data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Call an account server function (`sign_up` or `log_in`) for `email`; returns the status.
fn account(server: &Server, function: &str, email: &str) -> u16 {
    let form = format!("email={}&password=persistent+password", email.replace('@', "%40"));
    let answer = server.post(&format!("/api/{function}"), &form).expect("the server function answers");
    answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("an HTTP status")
}

#[test]
fn ctrl_c_stops_postgres_and_a_second_run_reuses_the_data() {
    let data = temp_data_dir("embedded");
    let first = Server::start(&data);
    first.wait_healthy();
    assert!(postgres_processes(&data) > 0, "the server runs its own Postgres");
    assert_eq!(account(&first, "sign_up", "kept@example.com"), 200);
    assert!(first.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0, "no Postgres of ours is left after Ctrl-C");

    let second = Server::start(&data);
    second.wait_healthy();
    assert_eq!(account(&second, "log_in", "kept@example.com"), 200, "the second run reuses the data");
    assert_eq!(account(&second, "sign_up", "kept@example.com"), 409, "the account is still there");
    assert!(second.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0);
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_cluster_left_by_a_killed_server_is_taken_over() {
    let data = temp_data_dir("killed");
    let mut first = Server::start(&data);
    first.wait_healthy();
    assert_eq!(account(&first, "sign_up", "orphan@example.com"), 200);
    first.child.kill().unwrap(); // SIGKILL: no chance to stop Postgres
    first.child.wait().unwrap();
    assert!(postgres_processes(&data) > 0, "the orphaned cluster is still running");

    let second = Server::start(&data);
    second.wait_healthy();
    assert_eq!(account(&second, "log_in", "orphan@example.com"), 200, "the account survived the kill");
    assert!(second.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0);
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_second_server_on_the_same_data_folder_is_refused_and_the_first_keeps_its_database() {
    let data = temp_data_dir("twice");
    let first = Server::start(&data);
    first.wait_healthy();
    assert_eq!(account(&first, "sign_up", "first@example.com"), 200);
    let out = Command::new(env!("CARGO_BIN_EXE_server"))
        .env_remove("DATABASE_URL")
        .env("SLUICE_DATA_DIR", &data)
        .env("SLUICE_BIND", format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another Sluice server"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(account(&first, "log_in", "first@example.com"), 200, "the first server's database is untouched");
    assert!(first.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0);
    let _ = std::fs::remove_dir_all(&data);
}

/// Root's home folder is `0700` on most machines, so the `postgres` user cannot reach a
/// checkout there. The first run must still work: the cluster moves under /var/lib/sluice,
/// the data folder links to it, and Ctrl-C, reuse and the one-server lock keep working.
#[test]
fn a_data_folder_under_a_private_parent_still_gets_a_cluster() {
    let is_root =
        std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false);
    if !is_root {
        eprintln!("skipped: only root runs Postgres as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let private = temp_data_dir("private-home");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = private.join("checkout").join(".data");
    std::fs::create_dir_all(&data).unwrap();
    let relocated = pgcluster::relocated_dir(&data.canonicalize().unwrap().join("postgres"));
    let _ = std::fs::remove_dir_all(&relocated);

    let first = Server::start(&data);
    first.wait_healthy();
    assert!(data.join("postgres").is_symlink(), "the data folder links to where the cluster lives");
    assert_eq!(std::fs::read_link(data.join("postgres")).unwrap(), relocated);
    assert!(relocated.join("PG_VERSION").exists(), "the cluster lives in {}", relocated.display());
    assert!(postgres_processes(&data) > 0, "the server runs its own Postgres");
    assert_eq!(account(&first, "sign_up", "private@example.com"), 200);
    assert!(first.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0, "no Postgres of ours is left after Ctrl-C");

    let second = Server::start(&data);
    second.wait_healthy();
    assert_eq!(account(&second, "log_in", "private@example.com"), 200, "the second run finds the same cluster");
    assert!(second.interrupt_and_wait().success());
    assert_eq!(postgres_processes(&data), 0);

    // A link somewhere else (placed by someone, or copied with another checkout) is refused,
    // and its target is left alone.
    let elsewhere = private.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::remove_file(data.join("postgres")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, data.join("postgres")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_server"))
        .env_remove("DATABASE_URL")
        .env("SLUICE_DATA_DIR", &data)
        .env("SLUICE_BIND", format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a link to"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was made in the link's target");
    let _ = std::fs::remove_dir_all(&relocated);
    let _ = std::fs::remove_dir_all(&private);
}
