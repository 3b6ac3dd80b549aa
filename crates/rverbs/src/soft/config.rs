//! Which software devices a process has and where their UDP endpoints live.
//!
//! In order of precedence:
//! 1. `RVERBS_ADDR` — a comma-separated list of `[NAME=]ADDR` entries, one
//!    device each (`10.0.0.1`, `fd00::2`, `auto`, `rdma1=192.0.2.2`);
//! 2. the TOML file named by `RVERBS_CONFIG`, else `/etc/rverbs/rverbs.toml`
//!    if it exists, with one `[[device]]` table per device (`name`, `addr`);
//! 3. one device, `rverbs0`, on the first free loopback address
//!    127.0.0.1, 127.0.0.2, … so that several processes on one host each get
//!    their own address and GID without any configuration.
//!
//! Devices not named get `rverbs0`, `rverbs1`, … in order. A bad value is an
//! error that names the variable or file, never a silent default.
//!
//! Also the on/off switches of the data path ([`switched_on`]):
//! `RVERBS_SAME_HOST`, `RVERBS_SAME_HOST_CMA`, `RVERBS_GSO`,
//! `RVERBS_POLL_PARK`, `RVERBS_POLL_YIELD`.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Environment variable listing the devices' addresses.
pub const ADDR_ENV: &str = "RVERBS_ADDR";
/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "RVERBS_CONFIG";
/// The config file read when `RVERBS_CONFIG` is not set, if it exists.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/rverbs/rverbs.toml";
/// Most devices one process may configure.
pub const MAX_DEVICES: usize = 16;
/// Longest device name (`ibv_device::name` holds 64 bytes with the NUL).
pub const MAX_NAME_LEN: usize = 63;

/// Whether the switch `var` is on: it is unless set to `0`.
pub(crate) fn switched_on(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v.trim() != "0")
}

/// Where a device's UDP endpoint (port 4791) binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceAddr {
    /// The first free address of 127.0.0.1, 127.0.0.2, … 127.0.0.254.
    LoopbackAuto,
    /// This address, which must belong to this host.
    Ip(IpAddr),
}

impl fmt::Display for DeviceAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceAddr::LoopbackAuto => f.write_str("auto"),
            DeviceAddr::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// How to create one software device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Its name; `None` picks the next free `rverbsN`.
    pub name: Option<String>,
    /// Where its UDP endpoint binds.
    pub addr: DeviceAddr,
}

impl DeviceConfig {
    /// A device on the first free loopback address.
    pub fn loopback() -> Self {
        DeviceConfig {
            name: None,
            addr: DeviceAddr::LoopbackAuto,
        }
    }

    /// A device on `ip`.
    pub fn at(ip: IpAddr) -> Self {
        DeviceConfig {
            name: None,
            addr: DeviceAddr::Ip(ip),
        }
    }

    /// The same, with a name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }
}

/// A configuration value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An environment variable holds a bad value.
    #[error("{var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The config file cannot be read or holds a bad value.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The process's device configs — `RVERBS_ADDR`, else the config file, else
/// one loopback device — and where they came from, for error messages.
pub(crate) fn load() -> Result<(Vec<DeviceConfig>, String), ConfigError> {
    load_from(|var| std::env::var_os(var), Path::new(DEFAULT_CONFIG_PATH))
}

fn load_from(
    getenv: impl Fn(&str) -> Option<std::ffi::OsString>,
    default_path: &Path,
) -> Result<(Vec<DeviceConfig>, String), ConfigError> {
    if let Some(raw) = getenv(ADDR_ENV) {
        let value = raw.into_string().map_err(|raw| ConfigError::Env {
            var: ADDR_ENV,
            value: raw.to_string_lossy().into_owned(),
            reason: "not valid UTF-8".into(),
        })?;
        return parse_addr_list(&value)
            .map(|c| (c, ADDR_ENV.to_string()))
            .map_err(|reason| ConfigError::Env {
                var: ADDR_ENV,
                value: value.clone(),
                reason,
            });
    }
    let path = match getenv(CONFIG_ENV) {
        Some(p) if p.is_empty() => {
            return Err(ConfigError::Env {
                var: CONFIG_ENV,
                value: String::new(),
                reason: "empty; unset it or name a config file".into(),
            })
        }
        Some(p) => Some(PathBuf::from(p)),
        None => default_path.exists().then(|| default_path.to_path_buf()),
    };
    match path {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
                path: path.clone(),
                reason: if getenv(CONFIG_ENV).is_some() {
                    format!("cannot read it (named by {CONFIG_ENV}): {e}")
                } else {
                    format!("cannot read it: {e}")
                },
            })?;
            let origin = format!("config file {}", path.display());
            parse_file(&text)
                .map(|c| (c, origin))
                .map_err(|reason| ConfigError::File { path, reason })
        }
        None => Ok((
            vec![DeviceConfig::loopback()],
            "the loopback default".into(),
        )),
    }
}

fn parse_addr_list(value: &str) -> Result<Vec<DeviceConfig>, String> {
    if value.trim().is_empty() {
        return Err("empty; unset it for the loopback default or give an address".into());
    }
    let configs = value
        .split(',')
        .map(|entry| {
            let entry = entry.trim();
            let (name, addr) = match entry.split_once('=') {
                Some((n, a)) => (Some(n.trim().to_string()), a.trim()),
                None => (None, entry),
            };
            Ok(DeviceConfig {
                name,
                addr: parse_addr(addr)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    check(&configs)?;
    Ok(configs)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    device: Vec<FileDevice>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDevice {
    name: Option<String>,
    addr: String,
}

fn parse_file(text: &str) -> Result<Vec<DeviceConfig>, String> {
    let file: FileConfig = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.device.is_empty() {
        return Err("no [[device]] tables".into());
    }
    let configs = file
        .device
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            Ok(DeviceConfig {
                name: d.name,
                addr: parse_addr(&d.addr).map_err(|e| format!("device #{}: {e}", i + 1))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    check(&configs)?;
    Ok(configs)
}

/// Parses `auto`, an IPv4 address, or an IPv6 address (brackets allowed).
pub(crate) fn parse_addr(s: &str) -> Result<DeviceAddr, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DeviceAddr::LoopbackAuto);
    }
    let bare = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    let ip: IpAddr = bare.parse().map_err(|_| {
        if s.parse::<std::net::SocketAddr>().is_ok() {
            format!(
                "{s:?} is not an IP address (the UDP port is always 4791; give the address only)"
            )
        } else {
            format!("{s:?} is not an IP address or \"auto\"")
        }
    })?;
    check_unicast(ip)?;
    Ok(DeviceAddr::Ip(ip))
}

fn check_unicast(ip: IpAddr) -> Result<(), String> {
    let bad = match ip {
        IpAddr::V4(v4) => {
            if v4.is_unspecified() {
                Some("the unspecified address gives no GID a peer can reach")
            } else if v4.is_multicast() {
                Some("a multicast address cannot be a device address")
            } else if v4.is_broadcast() {
                Some("the broadcast address cannot be a device address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                Some("the unspecified address gives no GID a peer can reach")
            } else if v6.is_multicast() {
                Some("a multicast address cannot be a device address")
            } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address needs a scope; use a global or unique-local address")
            } else {
                None
            }
        }
    };
    match bad {
        Some(why) => Err(format!("{ip}: {why}")),
        None => Ok(()),
    }
}

/// Checks names, duplicates and count of a device list.
pub(crate) fn check(configs: &[DeviceConfig]) -> Result<(), String> {
    if configs.len() > MAX_DEVICES {
        return Err(format!(
            "{} devices configured; at most {MAX_DEVICES}",
            configs.len()
        ));
    }
    let mut names = HashSet::new();
    let mut addrs = HashSet::new();
    for c in configs {
        if let Some(name) = &c.name {
            check_name(name)?;
            if !names.insert(name.as_str()) {
                return Err(format!("device name {name:?} given twice"));
            }
        }
        if let DeviceAddr::Ip(ip) = c.addr {
            if !addrs.insert(ip) {
                return Err(format!("address {ip} given twice"));
            }
        }
    }
    Ok(())
}

/// A device name must fit `ibv_device::name` and be a plain identifier.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty device name".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "device name {name:?} is longer than {MAX_NAME_LEN} bytes"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    {
        return Err(format!(
            "device name {name:?} may hold only letters, digits, '_', '-' and '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ffi::OsString;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn ip(s: &str) -> DeviceAddr {
        DeviceAddr::Ip(s.parse().unwrap())
    }

    fn load(vars: &[(&str, &str)]) -> Result<(Vec<DeviceConfig>, String), ConfigError> {
        load_from(env(vars), Path::new("/nonexistent/rverbs.toml"))
    }

    #[test]
    fn default_is_one_loopback_device() {
        let (got, origin) = load(&[]).unwrap();
        assert_eq!(got, vec![DeviceConfig::loopback()]);
        assert_eq!(origin, "the loopback default");
    }

    #[test]
    fn the_default_file_is_read_when_present() {
        let dir = std::env::temp_dir().join(format!("rverbs-cfg-default-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rverbs.toml");
        std::fs::write(&path, "[[device]]\naddr = \"10.9.8.7\"\n").unwrap();
        let (got, origin) = load_from(env(&[]), &path).unwrap();
        assert_eq!(got, vec![DeviceConfig::at("10.9.8.7".parse().unwrap())]);
        assert!(origin.contains("rverbs.toml"), "{origin}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn addr_env_lists_devices() {
        let (got, origin) = load(&[(ADDR_ENV, "10.0.0.1, rdma1=fd00::2,[fd00::3],auto")]).unwrap();
        assert_eq!(origin, "RVERBS_ADDR");
        assert_eq!(
            got,
            vec![
                DeviceConfig {
                    name: None,
                    addr: ip("10.0.0.1")
                },
                DeviceConfig {
                    name: Some("rdma1".into()),
                    addr: ip("fd00::2")
                },
                DeviceConfig {
                    name: None,
                    addr: ip("fd00::3")
                },
                DeviceConfig {
                    name: None,
                    addr: DeviceAddr::LoopbackAuto
                },
            ]
        );
    }

    #[test]
    fn addr_env_overrides_config_file() {
        let got = load(&[(ADDR_ENV, "10.0.0.9"), (CONFIG_ENV, "/nonexistent")])
            .unwrap()
            .0;
        assert_eq!(got, vec![DeviceConfig::at("10.0.0.9".parse().unwrap())]);
    }

    #[test]
    fn bad_addr_env_names_the_variable() {
        for (value, needle) in [
            ("10.0.0.300", "not an IP address"),
            ("", "empty"),
            ("0.0.0.0", "unspecified"),
            ("::", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("fe80::1", "link-local"),
            ("255.255.255.255", "broadcast"),
            ("10.0.0.1:4791", "port is always 4791"),
            ("10.0.0.1,10.0.0.1", "given twice"),
            ("a=10.0.0.1,a=10.0.0.2", "given twice"),
            ("bad name=10.0.0.1", "may hold only"),
            ("=10.0.0.1", "empty device name"),
        ] {
            let err = load(&[(ADDR_ENV, value)]).unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("RVERBS_ADDR="), "{value}: {msg}");
            assert!(msg.contains(needle), "{value}: {msg}");
        }
    }

    #[test]
    fn too_many_devices() {
        let list: Vec<String> = (1..=17).map(|i| format!("10.0.0.{i}")).collect();
        let err = load(&[(ADDR_ENV, &list.join(","))]).unwrap_err();
        assert!(err.to_string().contains("at most 16"), "{err}");
    }

    #[test]
    fn config_file_devices() {
        let dir = std::env::temp_dir().join(format!("rverbs-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ok.toml");
        std::fs::write(
            &path,
            "[[device]]\nname = \"east\"\naddr = \"192.0.2.2\"\n\n[[device]]\naddr = \"auto\"\n",
        )
        .unwrap();
        let (got, origin) = load(&[(CONFIG_ENV, path.to_str().unwrap())]).unwrap();
        assert!(origin.contains("ok.toml"), "{origin}");
        assert_eq!(
            got,
            vec![
                DeviceConfig {
                    name: Some("east".into()),
                    addr: ip("192.0.2.2")
                },
                DeviceConfig::loopback(),
            ]
        );

        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[[device]]\naddr = \"192.0.2.2\"\nport = 1\n").unwrap();
        let err = load(&[(CONFIG_ENV, bad.to_str().unwrap())]).unwrap_err();
        assert!(err.to_string().contains("bad.toml"), "{err}");
        assert!(err.to_string().contains("port"), "{err}");

        std::fs::write(&bad, "[[device]]\naddr = \"nope\"\n").unwrap();
        let err = load(&[(CONFIG_ENV, bad.to_str().unwrap())]).unwrap_err();
        assert!(err.to_string().contains("device #1"), "{err}");

        std::fs::write(&bad, "# nothing\n").unwrap();
        let err = load(&[(CONFIG_ENV, bad.to_str().unwrap())]).unwrap_err();
        assert!(err.to_string().contains("no [[device]]"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_config_file_names_the_variable() {
        let err = load(&[(CONFIG_ENV, "/nonexistent/rverbs.toml")]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/rverbs.toml"), "{msg}");
        assert!(msg.contains("RVERBS_CONFIG"), "{msg}");
        let err = load(&[(CONFIG_ENV, "")]).unwrap_err();
        assert!(err.to_string().starts_with("RVERBS_CONFIG="), "{err}");
    }

    #[test]
    fn long_names_are_rejected() {
        assert!(check_name(&"x".repeat(63)).is_ok());
        assert!(check_name(&"x".repeat(64)).is_err());
    }
}
