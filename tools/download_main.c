/* needle-download: the executable behind `needle download` (see download.c), linked with
 * libcurl. `needle download ARGS` runs it as `needle-download download ARGS`; run by hand,
 * `needle-download ARGS` is the same. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "download"))
        return cli_download.run(&cli_download, argc, argv);
    /* cli_parse reads the options from argv[2] on, after the command's name */
    char **with_name = malloc(((size_t)argc + 2) * sizeof *with_name);
    if (!with_name) return 1;
    with_name[0] = argv[0];
    with_name[1] = (char *)"download";
    for (int i = 1; i <= argc; i++) with_name[i + 1] = argv[i];
    const int rc = cli_download.run(&cli_download, argc + 1, with_name);
    free(with_name);
    return rc;
}
