// Command fakegpu is a device plugin for the local cluster's real nodes: it speaks the kubelet's device-plugin
// gRPC API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) and advertises fake GPUs, so that the scheduler, the
// kubelet's allocation, Kueue's GPU quota and the operator's `nprocPerNode: auto` run end to end on a machine
// without one. Each allocation sets NVIDIA_VISIBLE_DEVICES to the devices given, as NVIDIA's plugin does; no
// device node is mounted, so training inside uses gloo on the CPU.
//
// The kubelet removes every socket in its plugin directory when it restarts; the plugin then serves and registers
// again, as real plugins do.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	devices []*api.Device
	stop    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once: fake devices never turn unhealthy. It returns when the kubelet hangs up
// or the plugin stops.
func (p *plugin) ListAndWatch(_ *api.Empty, stream grpc.ServerStreamingServer[api.ListAndWatchResponse]) error {
	if err := stream.Send(&api.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *api.PreStartContainerRequest) (*api.PreStartContainerResponse, error) {
	return &api.PreStartContainerResponse{}, nil
}

func devices(node string, count int) []*api.Device {
	found := make([]*api.Device, 0, count)
	for i := 0; i < count; i++ {
		found = append(found, &api.Device{ID: fmt.Sprintf("fake-%s-%d", node, i), Health: api.Healthy})
	}
	return found
}

// serve listens on the plugin's socket and registers it with the kubelet; the returned server serves until
// stopped.
func serve(dir, socket, resource string, p *plugin) (*grpc.Server, error) {
	path := filepath.Join(dir, socket)
	_ = os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	server := grpc.NewServer()
	api.RegisterDevicePluginServer(server, p)
	go func() { _ = server.Serve(listener) }()
	if err := register(dir, socket, resource); err != nil {
		server.Stop()
		return nil, err
	}
	return server, nil
}

func register(dir, socket, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, filepath.Base(api.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: socket, ResourceName: resource, Options: &api.DevicePluginOptions{},
	})
	return err
}

func main() {
	dir := flag.String("plugin-dir", api.DevicePluginPath, "the kubelet's device-plugin directory")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 2, "devices on this node")
	node := flag.String("node", "node", "node name, part of each device's ID")
	flag.Parse()
	socket := "fakegpu-" + strings.ReplaceAll(*resource, "/", "_") + ".sock"
	p := &plugin{devices: devices(*node, *count), stop: make(chan struct{})}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	var server *grpc.Server
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(filepath.Join(*dir, socket)); server == nil || err != nil {
			// First start, or the kubelet restarted and cleared its directory: serve and register again.
			if server != nil {
				server.Stop()
			}
			if server, err = serve(*dir, socket, *resource, p); err != nil {
				log.Printf("fakegpu: not registered yet (%v); retrying", err)
			} else {
				log.Printf("fakegpu: %d x %s registered with the kubelet in %s", *count, *resource, *dir)
			}
		}
		select {
		case <-signals:
			close(p.stop)
			if server != nil {
				server.Stop()
			}
			return
		case <-tick.C:
		}
	}
}
