//! Test certificates from the openssl CLI: a CA, a server certificate for the loopback address
//! and a client certificate.

use std::path::Path;
use std::process::Command;

use crate::run_ok;

/// Runs the openssl CLI in `dir`; panics with its stderr on failure.
pub fn openssl(dir: &Path, args: &[&str]) {
    run_ok(
        Command::new("openssl").current_dir(dir).args(args),
        &format!("openssl {args:?} (needed for the TLS tests)"),
    );
}

/// A CA (`ca.crt`, `ca.key`), a server certificate for 127.0.0.1 and localhost (`server.crt`,
/// `server.key`) and a client certificate (`client.crt`, `client.key`), all signed by the CA,
/// EC P-256 keys in PKCS#8 PEM, valid two days.
pub fn make_pki(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
    ]);
    openssl(dir, &ca);
    issue(
        dir,
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        2,
    );
    issue(dir, "client", "extendedKeyUsage=clientAuth\n", 2);
}

/// A new EC P-256 key `NAME.key` and a certificate `NAME.crt` (subject `CN=NAME`, the openssl
/// extension lines `ext`, valid `days`) signed by `dir`'s `ca.crt`.
pub fn issue(dir: &Path, name: &str, ext: &str, days: u32) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let (key, csr, crt, extfile) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
        format!("{name}.ext"),
    );
    std::fs::write(dir.join(&extfile), ext).expect("write the extension file");
    let subj = format!("/CN={name}");
    let mut req = vec!["req"];
    req.extend(ec);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
    openssl(dir, &req);
    let days = days.to_string();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            &days,
            "-extfile",
            &extfile,
        ],
    );
}
