/* needle-serve: the executable behind `needle serve` (see serve.c). `needle serve ARGS`
 * runs it as `needle-serve serve ARGS`; run by hand, `needle-serve ARGS` is the same. */
#include <stdlib.h>
#include <string.h>

#include "../cli.h"

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "serve")) return cli_serve.run(&cli_serve, argc, argv);
    /* cli_parse reads the options from argv[2] on, after the command's name */
    char **with_name = malloc(((size_t)argc + 2) * sizeof *with_name);
    if (!with_name) return 1;
    with_name[0] = argv[0];
    with_name[1] = (char *)"serve";
    for (int i = 1; i <= argc; i++) with_name[i + 1] = argv[i];
    const int rc = cli_serve.run(&cli_serve, argc + 1, with_name);
    free(with_name);
    return rc;
}
