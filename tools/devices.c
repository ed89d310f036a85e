/* devices.c: `needle devices`, the compute devices the compiled-in backends find and
 * the backend a model would get by default. Exit 1 if the environment forces a backend
 * that cannot be used. */
#include "cli.h"

static int run_devices(const cli_command *self, int argc, char **argv) {
    int json = 0;
    const cli_option opts[] = {{"--json", NULL, CLI_FLAG, &json, 0, 0, NULL}, {0}};
    const int st = cli_parse(self, argc, argv, opts, NULL, 0);
    if (st != CLI_GO) return st;
    const int n = needle_device_count();
    const char *def = needle_default_backend();
    char err[512];
    snprintf(err, sizeof err, "%s", def ? "" : needle_last_error()); /* next calls clear it */
    if (json) printf("{\"devices\":[");
    for (int i = 0; i < n; i++) {
        needle_device_info d = {.size = sizeof d};
        if (needle_device_get(i, &d) != NEEDLE_OK) continue;
        if (json) {
            printf("%s{\"backend\":", i ? "," : "");
            cli_json_string(stdout, d.backend);
            printf(",\"name\":");
            cli_json_string(stdout, d.name);
            printf(",\"memory_bytes\":%llu,\"compute_units\":%d,\"capability\":",
                   (unsigned long long)d.memory_bytes, (int)d.compute_units);
            cli_json_string(stdout, d.capability);
            printf(",\"default\":%s}", d.is_default ? "true" : "false");
        } else {
            printf("%-6s %s  %.1f GiB  %d compute units  %s%s\n", d.backend, d.name,
                   (double)d.memory_bytes / (1024.0 * 1024.0 * 1024.0), (int)d.compute_units,
                   d.capability, d.is_default ? "  (default)" : "");
        }
    }
    if (json) {
        printf("],\"default_backend\":");
        if (def) cli_json_string(stdout, def);
        else printf("null");
        if (!def) {
            printf(",\"error\":");
            cli_json_string(stdout, err);
        }
        printf("}\n");
    } else if (def) {
        printf("default backend: %s\n", def);
    } else {
        printf("default backend: none\n");
        fprintf(stderr, "needle: %s\n", err);
    }
    return def ? 0 : 1;
}

const cli_command cli_devices = {
    "devices", "compute devices found, and the default backend",
    "usage: needle devices [--json]\n"
    "\n"
    "Lists one line per device the compiled-in backends find (backend, name, memory,\n"
    "compute units, capability), then the default backend: NEEDLE_BACKEND (or\n"
    "JAX_PLATFORM_NAME) when set, else the first backend with a device, the CPU last.\n"
    "Exits 1 when the environment forces a backend that cannot be used.\n"
    "\n"
    "options:\n"
    "  --json                  one JSON object on stdout: devices, default_backend (and\n"
    "                          error when there is none)\n"
    "  -h, --help              this text\n",
    run_devices};
