# needle serve in a container: build on Debian, run as a non-root user on a slim image
# with only the runtime libraries. See docs/serve.md.
#   docker build -t needle-serve .
#   docker run --rm -p 8080:8080 needle-serve
#   docker run --rm -p 8080:8080 -v $PWD/my.cact:/models/my.cact needle-serve --weights /models/my.cact
FROM debian:bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      gcc make cmake pkg-config libcjson-dev libmicrohttpd-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY include include
COPY src src
COPY tools tools
COPY models models
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DNEEDLE_CUDA=OFF -DNEEDLE_BUILD_TESTS=OFF \
      -DCMAKE_INSTALL_PREFIX=/opt/needle \
    && cmake --build build -j"$(nproc)" \
    && cmake --install build

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libcjson1 libmicrohttpd12 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home needle
COPY --from=build /opt/needle /opt/needle
ENV PATH=/opt/needle/bin:$PATH \
    LD_LIBRARY_PATH=/opt/needle/lib
USER 10001
EXPOSE 8080
# --host 0.0.0.0: reachable from outside the container; the demo model is the default
ENTRYPOINT ["needle", "serve", "--host", "0.0.0.0", "--port", "8080"]
