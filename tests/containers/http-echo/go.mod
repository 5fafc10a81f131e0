module bridge.test/http-echo

go 1.25.7
