package config

import (
	"fmt"
	"strings"
)

// Markdown renders the environment variables in vars as the tables of the
// configuration reference, one table per section in Sections order, with
// the gateway flag that overrides each variable.
func Markdown(vars []Var) string {
	var b strings.Builder
	for _, section := range Sections {
		var rows []Var
		for _, v := range vars {
			if v.Section == section {
				rows = append(rows, v)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### %s\n\n| Variable | Flag | Default | Meaning |\n|---|---|---|---|\n", section)
		for _, v := range rows {
			name := "`" + v.Name + "`"
			for _, a := range v.Aliases {
				name += "<br>(or `" + a + "`)"
			}
			def := "`" + v.Default + "`"
			if v.Default == "" {
				def = "(empty)"
			}
			flag := ""
			if v.Flag != "" {
				flag = "`--" + v.Flag + "`"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", name, flag, def, strings.ReplaceAll(v.Doc, "|", "\\|"))
		}
		b.WriteString("\n")
	}
	return b.String()
}
