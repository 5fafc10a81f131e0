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
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    for (who, ext) in [("server", "server.ext"), ("client", "client.ext")] {
        let key = format!("{who}.key");
        let csr = format!("{who}.csr");
        let crt = format!("{who}.crt");
        let subj = format!("/CN={who}");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(dir, &req);
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
                "2",
                "-extfile",
                ext,
            ],
        );
    }
}
