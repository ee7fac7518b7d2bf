package main

import (
	"flag"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/kvgate/kvgate/pkg/config"
)

const usageHeader = `gateway runs kvgate's OpenAI-compatible inference gateway in front of vLLM pods.

Usage: gateway [flags]

Every setting is an environment variable (see README.md); the flags below
override theirs when given. -v and -vmodule set klog's log verbosity.

Flags:
`

// parseArgs registers on fs a flag for every variable of config.Vars that
// has one, and klog's -v and -vmodule, and parses args (without the program
// name). It returns the lookup the configuration is read through: a
// variable whose flag was given reads the flag's value, any other reads
// env.
func parseArgs(fs *flag.FlagSet, args []string, env config.LookupFunc) (config.LookupFunc, error) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule"} {
		f := klogFlags.Lookup(name)
		fs.Var(f.Value, name, f.Usage)
	}
	byFlag := map[string]config.Var{}
	values := map[string]*string{}
	for _, v := range config.Vars {
		if v.Flag == "" {
			continue
		}
		byFlag[v.Flag] = v
		values[v.Flag] = fs.String(v.Flag, v.Default, v.Doc+" (env "+v.Name+")")
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHeader)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) {
		if v, ok := byFlag[f.Name]; ok {
			given[v.Name] = *values[f.Name]
		}
	})
	return func(name string) (string, bool) {
		if s, ok := given[name]; ok {
			return s, true
		}
		return env(name)
	}, nil
}
