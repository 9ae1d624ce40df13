/*
 * Checking stand-in for Apple's <dispatch/dispatch.h> (libdispatch), for
 * metal-shim's Linux syntax check only (see objc/NSObject.h). Under
 * Objective-C with ARC, dispatch objects are Objective-C objects, so they are
 * declared as protocols on NSObject, as the SDK's OS_OBJECT_DECL does.
 */
#pragma once
#import <objc/NSObject.h>

NS_ASSUME_NONNULL_BEGIN

@protocol OS_dispatch_object <NSObject>
@end
@protocol OS_dispatch_queue <OS_dispatch_object>
@end
@protocol OS_dispatch_queue_attr <OS_dispatch_object>
@end

typedef NSObject<OS_dispatch_queue> *dispatch_queue_t;
typedef NSObject<OS_dispatch_queue_attr> *dispatch_queue_attr_t;
typedef void (^dispatch_block_t)(void);

/* A serial queue is requested with a NULL attribute. */
#define DISPATCH_QUEUE_SERIAL NULL

/* Creates a queue (returned retained: ARC owns it). */
extern dispatch_queue_t dispatch_queue_create(const char *_Nullable label,
                                              dispatch_queue_attr_t _Nullable attr) NS_RETURNS_RETAINED;
/* Runs the block on the queue, later, without waiting for it. */
extern void dispatch_async(dispatch_queue_t queue, dispatch_block_t block);

/* Runs `block` once per process, whatever thread gets there first. */
typedef intptr_t dispatch_once_t;
extern void dispatch_once(dispatch_once_t *predicate, NS_NOESCAPE dispatch_block_t block);

NS_ASSUME_NONNULL_END
