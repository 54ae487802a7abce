//! The BusyBox root: a tar written in memory around the host's static BusyBox.

use std::ffi::OsString;
use std::io::Read as _;
use std::path::PathBuf;

use super::scratch::Scratch;
use super::{
    is_executable_file, run_checked, write_file, HostTools, ImageRecipe, AGENT_ID, AGENT_USER,
};
use crate::error::DockerError;

impl ImageRecipe {
    /// Writes the BusyBox root as a tar archive in the scratch directory.
    pub(super) async fn busybox_archive(
        &self,
        tools: &HostTools,
        scratch: &Scratch,
    ) -> Result<PathBuf, DockerError> {
        let busybox = tools
            .busybox
            .as_ref()
            .ok_or_else(|| DockerError::HostToolMissing {
                program: "busybox".to_owned(),
                package: "busybox-static".to_owned(),
            })?;
        let listing = run_checked(
            busybox,
            &[OsString::from("--list-full")],
            &[],
            self.command_timeout,
        )
        .await?;
        let applets = applet_paths(&String::from_utf8_lossy(&listing.stdout));
        let binary = std::fs::read(&busybox.program).map_err(|source| DockerError::Io {
            action: "reading",
            path: busybox.program.clone(),
            source,
        })?;
        let bytes = busybox_root_tar(&binary, &applets).map_err(|source| DockerError::Io {
            action: "assembling the BusyBox root for",
            path: busybox.program.clone(),
            source,
        })?;
        let archive = scratch.path().join("busybox.tar");
        write_file(&archive, &bytes, 0o600)?;
        self.say(&format!(
            "  BusyBox root with {} applet links from {}",
            applets.len(),
            busybox.program.display()
        ));
        Ok(archive)
    }
}

/// Finds the host's BusyBox and checks it is statically linked (the image has no libc).
pub(super) fn find_static_busybox() -> Result<PathBuf, DockerError> {
    let candidates = ["/bin/busybox", "/usr/bin/busybox"].map(PathBuf::from);
    let Some(path) = candidates.into_iter().find(|path| is_executable_file(path)) else {
        return Err(DockerError::HostToolMissing {
            program: "busybox".to_owned(),
            package: "busybox-static".to_owned(),
        });
    };
    let mut head = Vec::new();
    std::fs::File::open(&path)
        .and_then(|file| file.take(64 * 1024).read_to_end(&mut head))
        .map_err(|source| DockerError::Io {
            action: "reading",
            path: path.clone(),
            source,
        })?;
    match elf_static_check(&head) {
        Ok(()) => Ok(path),
        Err(reason) => Err(DockerError::BusyboxNotStatic { path, reason }),
    }
}

/// Accepts a 64-bit little-endian ELF file without a program interpreter (`PT_INTERP`).
pub(super) fn elf_static_check(head: &[u8]) -> Result<(), String> {
    const PT_INTERP: u32 = 3;
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        return Err("not an ELF file".to_owned());
    }
    if head[4] != 2 || head[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".to_owned());
    }
    let u16_at = |at: usize| {
        head.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let phoff = head
        .get(0x20..0x28)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes);
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, u16_at(0x36), u16_at(0x38)) else {
        return Err("truncated ELF header".to_owned());
    };
    for index in 0..usize::from(phnum) {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|off| off.checked_add(index * usize::from(phentsize)));
        let kind = at
            .and_then(|at| head.get(at..at + 4))
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match kind {
            Some(PT_INTERP) => return Err("it is dynamically linked".to_owned()),
            Some(_) => {}
            None => return Err("program headers out of reach".to_owned()),
        }
    }
    Ok(())
}

/// The applet install paths from `busybox --list-full` (`bin/sh`, `usr/bin/env`, …), without
/// BusyBox itself and without anything that could escape the root.
fn applet_paths(listing: &str) -> Vec<String> {
    let mut paths: Vec<String> = listing
        .lines()
        .map(|line| line.trim().trim_start_matches('/').to_owned())
        .filter(|path| {
            !path.is_empty()
                && path != "bin/busybox"
                && path
                    .split('/')
                    .all(|part| !part.is_empty() && part != "." && part != "..")
        })
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// The BusyBox root as a tar: `/bin/busybox`, a link per applet, `/tmp` 1777, `/root`, the
/// agent's home, and `/etc/passwd` and `/etc/group` naming uid/gid 0 and 1000.
fn busybox_root_tar(busybox: &[u8], applets: &[String]) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs: Vec<(String, u32, u32)> = vec![
        ("bin".into(), 0o755, 0),
        ("dev".into(), 0o755, 0),
        ("etc".into(), 0o755, 0),
        ("home".into(), 0o755, 0),
        (format!("home/{AGENT_USER}"), 0o755, AGENT_ID),
        ("proc".into(), 0o555, 0),
        ("root".into(), 0o700, 0),
        ("sys".into(), 0o555, 0),
        ("tmp".into(), 0o1777, 0),
        ("usr".into(), 0o755, 0),
        ("var".into(), 0o755, 0),
    ];
    for applet in applets {
        let mut parent = String::new();
        let parts: Vec<&str> = applet.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            if !dirs.iter().any(|(dir, _, _)| *dir == parent) {
                dirs.push((parent.clone(), 0o755, 0));
            }
        }
    }
    dirs.sort();
    for (dir, mode, owner) in &dirs {
        let mut header = tar_header(tar::EntryType::Directory, *mode, *owner);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }

    let mut header = tar_header(tar::EntryType::Regular, 0o755, 0);
    header.set_size(busybox.len() as u64);
    builder.append_data(&mut header, "bin/busybox", busybox)?;

    let passwd = format!(
        "root:x:0:0:root:/root:/bin/sh\n{AGENT_USER}:x:{AGENT_ID}:{AGENT_ID}:{AGENT_USER}:/home/{AGENT_USER}:/bin/sh\n"
    );
    let group = format!("root:x:0:\n{AGENT_USER}:x:{AGENT_ID}:\n");
    for (path, text) in [("etc/passwd", passwd), ("etc/group", group)] {
        let mut header = tar_header(tar::EntryType::Regular, 0o644, 0);
        header.set_size(text.len() as u64);
        builder.append_data(&mut header, path, text.as_bytes())?;
    }

    for applet in applets {
        let mut header = tar_header(tar::EntryType::Symlink, 0o777, 0);
        builder.append_link(&mut header, applet, "/bin/busybox")?;
    }
    builder.into_inner()
}

pub(super) fn tar_header(kind: tar::EntryType, mode: u32, owner: u32) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(owner.into());
    header.set_gid(owner.into());
    header.set_size(0);
    header.set_mtime(0);
    header
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn elf_with_program_headers(kinds: &[u32]) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56 * kinds.len()];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&u16::try_from(kinds.len()).unwrap().to_le_bytes());
        for (index, kind) in kinds.iter().enumerate() {
            let at = 64 + 56 * index;
            elf[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        }
        elf
    }

    #[test]
    fn static_elf_is_accepted_and_dynamic_or_foreign_refused() {
        assert_eq!(
            elf_static_check(&elf_with_program_headers(&[6, 1, 1])),
            Ok(())
        );
        let dynamic = elf_static_check(&elf_with_program_headers(&[6, 3, 1])).unwrap_err();
        assert!(dynamic.contains("dynamically linked"), "{dynamic}");
        assert!(elf_static_check(b"#!/bin/sh\necho not elf\n").is_err());
        let mut truncated = elf_with_program_headers(&[1, 1]);
        truncated.truncate(80);
        assert!(elf_static_check(&truncated).is_err());
    }

    #[test]
    fn applet_paths_drop_busybox_itself_and_escapes() {
        let listing = "bin/sh\nusr/bin/env\nbin/busybox\n/bin/ls\nbin/../../etc/x\n\nbin/sh\n";
        assert_eq!(
            applet_paths(listing),
            vec!["bin/ls", "bin/sh", "usr/bin/env"]
        );
    }

    #[test]
    fn busybox_root_has_links_users_and_a_sticky_tmp() {
        let applets = vec!["bin/sh".to_owned(), "usr/sbin/chroot".to_owned()];
        let bytes = busybox_root_tar(b"\x7fELF fake", &applets).unwrap();
        let mut archive = tar::Archive::new(bytes.as_slice());
        struct Seen {
            kind: tar::EntryType,
            mode: u32,
            uid: u64,
            link: Option<String>,
            body: Vec<u8>,
        }
        let mut seen: HashMap<String, Seen> = HashMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let header = entry.header().clone();
            let link = entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut body = Vec::new();
            entry.read_to_end(&mut body).unwrap();
            let record = Seen {
                kind: header.entry_type(),
                mode: header.mode().unwrap(),
                uid: header.uid().unwrap(),
                link,
                body,
            };
            seen.insert(path.trim_end_matches('/').to_owned(), record);
        }
        assert_eq!(seen["tmp"].mode, 0o1777);
        assert_eq!(seen["home/agent"].uid, 1000);
        assert_eq!(seen["usr/sbin"].kind, tar::EntryType::Directory);
        assert_eq!(seen["bin/busybox"].body, b"\x7fELF fake");
        assert_eq!(seen["bin/busybox"].mode, 0o755);
        assert_eq!(seen["bin/sh"].kind, tar::EntryType::Symlink);
        assert_eq!(seen["bin/sh"].link.as_deref(), Some("/bin/busybox"));
        assert_eq!(
            seen["usr/sbin/chroot"].link.as_deref(),
            Some("/bin/busybox")
        );
        let passwd = String::from_utf8(seen["etc/passwd"].body.clone()).unwrap();
        assert!(passwd.contains("agent:x:1000:1000:"), "{passwd}");
        let group = String::from_utf8(seen["etc/group"].body.clone()).unwrap();
        assert!(group.contains("agent:x:1000:"), "{group}");
    }
}
