// Command etcd is upstream etcd's server entry point, built at the version
// k8s.io/kubernetes pins, so the local cluster needs no prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
