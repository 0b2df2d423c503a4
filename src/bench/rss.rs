//! The resident memory of a local server, read from `/proc` (Linux only).
//!
//! Without an explicit pid, the server is found as the process owning the
//! listening TCP socket on the benchmarked port.

use std::fs;

/// Resident set size of `pid` in bytes, if it can be read.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process listening on `port` on this machine, if one can be seen.
pub fn find_listener(port: u16) -> Option<u32> {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| fs::read_to_string(path).ok())
        .flat_map(|table| listening_inodes(&table, port))
        .collect();
    if inodes.is_empty() {
        return None;
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = fs::read_link(fd.path())
                && wanted.iter().any(|w| target.as_os_str() == w.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// Socket inodes in a `/proc/net/tcp` table that listen on `port`.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols.get(1)?.rsplit_once(':')?.1;
            let listening = *cols.get(3)? == LISTEN;
            let matches = u16::from_str_radix(local_port, 16).ok()? == port;
            (listening && matches).then(|| cols.get(9).map(|s| (*s).to_owned()))?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_listening_sockets_by_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1B9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0\n\
   1: 0100007F:1B9E 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0\n\
   2: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0\n";
        assert_eq!(listening_inodes(table, 7070), vec!["4242".to_owned()]);
        assert!(listening_inodes(table, 80).is_empty());
    }

    #[test]
    fn reads_our_own_resident_memory() {
        assert!(resident_bytes(std::process::id()).is_some_and(|b| b > 0));
    }

    #[test]
    fn finds_a_local_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert_eq!(find_listener(port), Some(std::process::id()));
    }
}
