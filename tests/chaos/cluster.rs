//! A PostgreSQL cluster of the test's own: `initdb` in a temporary directory, `pg_ctl` on
//! a free port of 127.0.0.1, run as the `postgres` OS user (initdb refuses root). The
//! shared server on 5432 is never touched. Stopped (`-m immediate`) and deleted on drop.

use std::path::{Path, PathBuf};
use std::process::Output;

pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
}

/// The newest `/usr/lib/postgresql/<version>/bin` with `initdb` and `pg_ctl`.
fn server_binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").exists() && bin.join("pg_ctl").exists()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "initdb and pg_ctl not found under /usr/lib/postgresql/*/bin: this test starts a \
             PostgreSQL cluster of its own; install the server (`apt-get install postgresql`, \
             as .ci/services does)"
        )
    })
}

/// Runs `program args…` as the `postgres` OS user.
fn as_postgres(program: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new("runuser");
    command
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args);
    command
}

fn check(what: &str, output: std::io::Result<Output>) {
    let output = output.unwrap_or_else(|e| {
        panic!("{what}: could not run `runuser` (util-linux), needed to run PostgreSQL as the postgres user: {e}")
    });
    assert!(
        output.status.success(),
        "{what} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PrivatePostgres {
    /// Creates and starts the cluster (blocking: call it before the run starts).
    pub fn start() -> Self {
        let bin = server_binaries();
        let user = std::process::Command::new("id").arg("postgres").output();
        assert!(
            user.is_ok_and(|o| o.status.success()),
            "no `postgres` OS user: initdb refuses to run as root, and this test runs the \
             private cluster as that user (installing the postgresql package creates it)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let data = std::env::temp_dir().join(format!(
            "tower-webhook-chaos-pg-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let cluster = Self { bin, data, port };
        let data = cluster.data.to_str().unwrap().to_owned();
        check(
            "initdb",
            as_postgres(
                &cluster.bin.join("initdb"),
                &[
                    "-D",
                    &data,
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "--no-locale",
                    "-E",
                    "UTF8",
                ],
            )
            .output(),
        );
        cluster.start_again_blocking();
        cluster
    }

    fn pg_ctl_start_args(&self) -> Vec<String> {
        let data = self.data.to_str().unwrap();
        let options = format!(
            "-h 127.0.0.1 -p {} -k {data} -c fsync=off -c max_connections=100",
            self.port
        );
        [
            "-D",
            data,
            "-l",
            &format!("{data}/server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            &options,
            "start",
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn start_again_blocking(&self) {
        let args = self.pg_ctl_start_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        check(
            "pg_ctl start",
            as_postgres(&self.bin.join("pg_ctl"), &args).output(),
        );
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server as a crash would (`-m immediate`: no checkpoint, backends killed;
    /// the next start recovers from the WAL), without blocking the runtime.
    pub async fn crash(&self) {
        let data = self.data.to_str().unwrap();
        let command = as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", data, "-m", "immediate", "-w", "stop"],
        );
        check(
            "pg_ctl stop -m immediate",
            tokio::process::Command::from(command).output().await,
        );
    }

    /// Starts the stopped server again on the same port and data, without blocking the
    /// runtime.
    pub async fn start_again(&self) {
        let args = self.pg_ctl_start_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let command = as_postgres(&self.bin.join("pg_ctl"), &args);
        check(
            "pg_ctl start",
            tokio::process::Command::from(command).output().await,
        );
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Some(data) = self.data.to_str() {
            let _ = as_postgres(
                &self.bin.join("pg_ctl"),
                &["-D", data, "-m", "immediate", "-w", "stop"],
            )
            .output();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
