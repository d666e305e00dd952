package shim

import (
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/cklite/cklite/pkg/exechelper"
	"github.com/cklite/cklite/runtime"
)

// Register registers the task service as pkg/shim's ttrpc plugin (like runc-v2's task plugin).
func Register() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			// The serving shim runs in the bundle: CRIU's wrapper lives there (see criuproc.go).
			wrapper, err := exechelper.Path()
			if err != nil {
				return nil, err
			}
			if err := runtime.InstallCRIUWrapper(".cklite-criu", wrapper); err != nil {
				return nil, err
			}
			return newService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service), ic.Properties[plugins.PropertyGRPCAddress])
		},
	})
}
