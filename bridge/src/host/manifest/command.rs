//! The manifest's `command`: its program found (an absolute path, or a name
//! on `PATH`) and checked to be one nobody else can rewrite. Separate because
//! it is the one check that looks at files outside the manifest, and whoever
//! can change the program chooses what runs as you.

use std::{
    ffi::OsString,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
};

use super::{refuse, Machine, Refused};

/// The command's program: an absolute path that is an executable file, or a
/// bare name found on `PATH` now.
pub(super) fn resolve_command(command: &[String], machine: &Machine) -> Result<Vec<OsString>, Refused> {
    let Some(program) = command.first() else {
        return refuse(
            "\"command\" is empty: give the program and its arguments, e.g. [\"my-agent\", \"--acp\"]",
        );
    };
    let is_exec = |p: &Path| {
        std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    };
    let p = Path::new(program);
    let resolved = if p.is_absolute() {
        if !is_exec(p) {
            return refuse(format!("\"command\": {program} is not an executable file"));
        }
        p.to_path_buf()
    } else if program.contains('/') {
        return refuse(format!(
            "\"command\": '{program}' is a relative path: give an absolute path, or a name found on PATH"
        ));
    } else {
        let path = machine.path.clone().unwrap_or_default();
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|c| c.is_absolute() && is_exec(c))
            .ok_or_else(|| Refused(format!("\"command\": '{program}' was not found on PATH")))?
    };
    check_program(&resolved, machine)?;
    let mut argv = vec![resolved.into_os_string()];
    argv.extend(command[1..].iter().map(OsString::from));
    Ok(argv)
}

/// Whoever can rewrite the program chooses what runs as you, like whoever can
/// write the manifest: the file it resolves to (links followed) is refused when
/// anyone may write it (world-writable, root's included), or when it belongs to
/// another user who is not root (system programs are root's; a group-writable
/// file of yours or root's is taken: user-private groups make that common).
fn check_program(program: &Path, machine: &Machine) -> Result<(), Refused> {
    let meta = std::fs::metadata(program)
        .map_err(|e| Refused(format!("\"command\": cannot read {}: {e}", program.display())))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o002 != 0 {
        return refuse(format!(
            "\"command\": {} is writable by everyone (mode {mode:04o}): anyone could change what runs as \
             you; chmod o-w it",
            program.display()
        ));
    }
    if meta.uid() != machine.uid && meta.uid() != 0 {
        return refuse(format!(
            "\"command\": {} is owned by uid {}, neither you (uid {}) nor root: its owner could change what \
             runs as you",
            program.display(),
            meta.uid(),
            machine.uid
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use crate::host::manifest::test_support::{parse_str, with_program};

    #[test]
    fn a_command_anyone_may_write_or_another_user_owns_is_refused() {
        let (dir, m) = with_program();
        let prog = dir.path().join("my-agent");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).unwrap_err().0;
        assert!(err.contains("writable by everyone"), "{err}");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o775)).unwrap();
        parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).expect("group-writable, yours: taken");
        // Owned by someone else (only when this test may chown).
        if std::os::unix::fs::chown(&prog, Some(65534), None).is_ok() {
            let err = parse_str(r#"{"name":"a","command":["my-agent"]}"#, &m).unwrap_err().0;
            assert!(err.contains("owned by uid 65534"), "{err}");
        }
    }
}
